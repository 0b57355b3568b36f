# Vendored from colossalai_examples (see README.md), rewritten by tests/peers/vendor.py: its imports only.
from pathlib import Path
from ember.compat.colossalai.logging import get_dist_logger
import ember.compat.colossalai as colossalai
import torch
import os
from ember.compat.colossalai.core import global_context as gpc
from ember.compat.colossalai.utils import get_dataloader
from tests.seeds.standins.torchvision import transforms
from ember.compat.colossalai.nn.lr_scheduler import CosineAnnealingLR
from tests.seeds.standins.torchvision.datasets import CIFAR10
from tests.seeds.standins.torchvision.models import resnet34
from tqdm import tqdm


def main():
    colossalai.launch_from_torch(config='./config.py')

    logger = get_dist_logger()

    # build resnet
    model = resnet34(num_classes=10)

    # build dataloaders
    train_dataset = CIFAR10(root=Path(os.environ.get('DATA', './data')),
                            download=True,
                            transform=transforms.Compose([
                                transforms.RandomCrop(size=32, padding=4),
                                transforms.RandomHorizontalFlip(),
                                transforms.ToTensor(),
                                transforms.Normalize(mean=[0.4914, 0.4822, 0.4465], std=[0.2023, 0.1994, 0.2010]),
                            ]))

    train_dataloader = get_dataloader(
        dataset=train_dataset,
        shuffle=True,
        batch_size=gpc.config.BATCH_SIZE,
        num_workers=1,
        pin_memory=True,
    )

    # build criterion
    criterion = torch.nn.CrossEntropyLoss()

    # optimizer
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)

    # lr_scheduler
    lr_scheduler = CosineAnnealingLR(optimizer, total_steps=gpc.config.NUM_EPOCHS)

    engine, train_dataloader, test_dataloader, _ = colossalai.initialize(
        model,
        optimizer,
        criterion,
        train_dataloader,
    )

    # verify gradient accumulation
    engine.train()
    for idx, (img, label) in enumerate(train_dataloader):
        img = img.cuda()
        label = label.cuda()

        engine.zero_grad()
        output = engine(img)
        train_loss = engine.criterion(output, label)
        engine.backward(train_loss)
        engine.step()
        lr_scheduler.step()

        ele_1st = next(model.parameters()).flatten()[0]
        logger.info(f'iteration {idx}, loss: {train_loss}, 1st element of parameters: {ele_1st.item()}')

        # only run for 4 iterations
        if idx == 3:
            break


if __name__ == '__main__':
    main()
