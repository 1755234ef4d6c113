"""pflower ClientApp: local data, the method's client role, persistent personal state."""
