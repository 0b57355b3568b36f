# The Colossal-AI tutorial's config.py, its import rewritten (values scaled to the stand-in data).
from ember.compat.colossalai.amp import AMP_TYPE

BATCH_SIZE = 32
NUM_EPOCHS = 4

fp16 = dict(mode=AMP_TYPE.TORCH)
