"""``titans.model``: the models the examples take from Colossal-AI's model zoo."""
