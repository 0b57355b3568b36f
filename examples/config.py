# An ember config is a plain Python file: ember's own keys are validated, the rest are yours.
BATCH_SIZE = 32
NUM_EPOCHS = 12
LEARNING_RATE = 2e-3

seed = 0
gradient_accumulation = 1
clip_grad_norm = 1.0
