"""Host I/O: probes and checks of the machine servelab runs on."""
