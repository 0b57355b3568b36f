"""A stand-in for the ``titans`` package (Colossal-AI's model zoo) the examples import from."""
