"""Service layer: configuration, storage, permissions and the operations the API exposes."""
