# Vendored from colossalai_examples (see README.md), rewritten by tests/peers/vendor.py: its imports only.
parallel = dict(
    data=1,
    pipeline=1,
    tensor=dict(size=2, mode='1d'),
)
