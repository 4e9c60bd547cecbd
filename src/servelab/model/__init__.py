"""The performance model: where the time of a prefill or decode step goes, before a server is launched.

Pure functions over plain data (the loaders of the bundled data files are the only I/O). The entry
points are `predict.predict()` for one configuration and `step.step_time()` for the simulator.
"""
