"""`servelab ui`: a read-only local web page over the store (stdlib HTTP server, no framework)."""
