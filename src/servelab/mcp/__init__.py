"""`servelab mcp`: the whole loop as Model Context Protocol tools, for agents (docs/cli/mcp.md).

A front end beside the CLI, not a second implementation: a tool that has a command runs that command
(`servelab … --json`) in a child process, so its result is the command's JSON view and its error the
command's message and hint; a study runs as a child `servelab tune`, which takes the study's lease as
any driver does; only what reads the store (a study's progress, the plan) is done here."""
