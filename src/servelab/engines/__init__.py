"""Engine adapters behind one protocol (`base.Engine`) and one registry (`registry.get`)."""
