# Vendored from colossalai_examples (see README.md), rewritten by tests/peers/vendor.py: its imports only.
from ember.compat.colossalai.amp import AMP_TYPE

BATCH_SIZE = 128
NUM_EPOCHS = 200

gradient_accumulation = 4
