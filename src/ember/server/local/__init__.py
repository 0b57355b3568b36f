"""``ember ui``: the console over a local store, and the index that keeps its database in step with the store."""
