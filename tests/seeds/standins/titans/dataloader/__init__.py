"""``titans.dataloader``: the CIFAR-10 loaders the examples build."""
