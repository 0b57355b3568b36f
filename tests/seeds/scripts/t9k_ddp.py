"""T9k's DDP MNIST example with experiment management, after the import rewrite.

``from t9k import em`` became ``from ember.compat.t9k import em``; torchvision's MNIST became
:class:`SyntheticMNIST` (smaller, so the logging interval and epochs are smaller too).
Everything else follows the T9k program: plain torch.distributed, ``if rank == 0`` around
every ``em`` call, ``logging.basicConfig`` at import, ``em.login()`` with no arguments.
"""

import argparse
import logging

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

from ember.compat.t9k import em

parser = argparse.ArgumentParser(description="Distributed training of PyTorch model for MNIST with DDP.")
parser.add_argument(
    "--backend",
    type=str,
    help="Distributed backend",
    choices=[dist.Backend.GLOO, dist.Backend.NCCL, dist.Backend.MPI],
    default=dist.Backend.GLOO,
)
parser.add_argument("--no_cuda", action="store_true", default=False, help="Disable CUDA training.")
logging.basicConfig(format="%(message)s", level=logging.INFO)

hparams = {
    "batch_size": 32 * 2,
    "epochs": 3,
    "learning_rate": 0.001 * 2,
    "learning_rate_decay_period": 1,
    "learning_rate_decay_factor": 0.7,
    "conv_channels1": 32,
    "conv_channels2": 64,
    "conv_channels3": 64,
    "conv_kernel_size": 3,
    "maxpool_size": 2,
    "linear_features1": 64,
    "seed": 1,
}


class SyntheticMNIST(torch.utils.data.Dataset):
    """Stand-in for ``datasets.MNIST`` with ToTensor + Normalize(0.5, 0.5): 1x28x28 images in
    [-1, 1] of 10 classes, each class a fixed random pattern under noise."""

    def __init__(self, train: bool, size: int) -> None:
        g = torch.Generator().manual_seed(0)
        patterns = torch.rand(10, 1, 28, 28, generator=g)
        g.manual_seed(1 if train else 2)
        self.targets = torch.randint(0, 10, (size,), generator=g)
        images = 0.6 * patterns[self.targets] + 0.4 * torch.rand(size, 1, 28, 28, generator=g)
        self.data = (images - 0.5) / 0.5

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        return self.data[i], int(self.targets[i])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, hparams["conv_channels1"], hparams["conv_kernel_size"], 1)
        self.conv2 = nn.Conv2d(hparams["conv_channels1"], hparams["conv_channels2"], hparams["conv_kernel_size"], 1)
        self.conv3 = nn.Conv2d(hparams["conv_channels2"], hparams["conv_channels3"], hparams["conv_kernel_size"], 1)
        self.pool = nn.MaxPool2d(hparams["maxpool_size"], hparams["maxpool_size"])
        self.dense1 = nn.Linear(576, hparams["linear_features1"])
        self.dense2 = nn.Linear(hparams["linear_features1"], 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = F.relu(self.conv3(x))
        x = torch.flatten(x, 1)
        x = F.relu(self.dense1(x))
        output = F.softmax(self.dense2(x), dim=1)
        return output


def train(scheduler):
    global global_step
    for epoch in range(1, epochs + 1):
        model.train()
        for step, (data, target) in enumerate(train_loader, 1):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            output = model(data)
            loss = criterion(output, target)
            loss.backward()
            optimizer.step()

            if step % (10 // world_size) == 0:  # 500 // world_size on the real MNIST
                train_loss = loss.item()
                logging.info(
                    f"epoch {epoch:d}/{epochs:d}, batch {step:5d}/{steps_per_epoch:d} with loss: {train_loss:.4f}"
                )
                global_step = (epoch - 1) * steps_per_epoch + step

                if rank == 0:
                    run.log(type="train", metrics={"loss": train_loss}, step=global_step, epoch=epoch)

        scheduler.step()
        global_step = epoch * steps_per_epoch
        test(val=True, epoch=epoch)


def test(val=False, epoch=None):
    label = "val" if val else "test"
    model.eval()
    running_loss = 0.0
    correct = 0

    with torch.no_grad():
        loader = val_loader if val else test_loader
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            loss = criterion(output, target)
            running_loss += loss.item()
            prediction = output.max(1)[1]
            correct += (prediction == target).sum().item()

    test_loss = running_loss / len(loader)
    test_accuracy = correct / len(loader.dataset)
    msg = f"{label:s} loss: {test_loss:.4f}, {label:s} accuracy: {test_accuracy:.4f}"
    if val:
        msg = f"epoch {epoch:d}/{epochs:d} with " + msg
    logging.info(msg)

    if rank == 0:
        run.log(type=label, metrics={"loss": test_loss, "accuracy": test_accuracy}, step=global_step, epoch=epoch)


if __name__ == "__main__":
    args = parser.parse_args()

    use_cuda = not args.no_cuda and torch.cuda.is_available()
    if use_cuda:
        logging.info("Using CUDA")
    device = torch.device("cuda" if use_cuda else "cpu")
    kwargs = {"num_workers": 1, "pin_memory": True} if use_cuda else {}

    logging.info(f"Using distributed PyTorch with {args.backend} backend")
    dist.init_process_group(backend=args.backend)
    rank = dist.get_rank()
    world_size = dist.get_world_size()

    if rank == 0:
        run = em.create_run(name="mnist_torch_distributed", hparams=hparams)

    torch.manual_seed(hparams["seed"])

    model = Net().to(device)
    model = DDP(model)
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.Adam(model.parameters(), lr=hparams["learning_rate"])
    scheduler = optim.lr_scheduler.StepLR(
        optimizer, step_size=hparams["learning_rate_decay_period"], gamma=hparams["learning_rate_decay_factor"]
    )

    train_dataset = SyntheticMNIST(train=True, size=1920)
    train_dataset, val_dataset = torch.utils.data.random_split(train_dataset, [1600, 320])
    test_dataset = SyntheticMNIST(train=False, size=640)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=hparams["batch_size"], shuffle=True, **kwargs)
    val_loader = torch.utils.data.DataLoader(val_dataset, batch_size=400, shuffle=False, **kwargs)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=1000, shuffle=False, **kwargs)

    global_step = 0
    epochs = hparams["epochs"]
    steps_per_epoch = len(train_loader)
    train(scheduler)
    test()

    if rank == 0:
        torch.save(model.state_dict(), "model_state_dict.pt")
        model_artifact = em.create_artifact(name="mnist_torch_saved_model")
        model_artifact.add_file("model_state_dict.pt")
        run.mark_output(model_artifact)

    if rank == 0:
        run.finish()
        em.login()
        run.upload(folder="em-examples", make_folder=True)
