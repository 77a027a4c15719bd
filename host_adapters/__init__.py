"""Host adapters: one module per host effect, each an interface, a real implementation and a fake."""
