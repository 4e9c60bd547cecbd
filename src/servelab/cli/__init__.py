"""The command line: one module per command group; parse, call one service, render."""
