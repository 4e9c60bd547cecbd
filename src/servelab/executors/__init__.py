"""Where a study's trials run: this machine or one SSH host (`local`), or the nodes of a Ray cluster (`ray`)."""
