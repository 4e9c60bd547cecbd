"""Test-support servers and models (fault server, real engines, tiny models); see each module."""
