"""servelab: deploy a large LLM on a GPU box and make it fast, reproducibly and verifiably."""

__version__ = "0.1.0"
