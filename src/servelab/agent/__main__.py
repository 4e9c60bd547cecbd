"""`python -m servelab.agent`: the agent's serve loop on stdin/stdout (servelab.agent.serve)."""

from servelab.agent.serve import main

main()
