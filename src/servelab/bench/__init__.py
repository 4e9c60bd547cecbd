"""`servelab bench`: measuring an OpenAI-compatible inference server honestly and cheaply."""
