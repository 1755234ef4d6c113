"""The app's model, data and training loop, in the shape of Flower's quickstart-pytorch.

The quickstart downloads CIFAR-10 with flwr-datasets; this app reads scikit-learn's bundled
digits as 3x32x32 images so that it runs offline. Everything else keeps the quickstart's shape:
`load_data` returns DataLoaders of `{"img", "label"}` batches, `train` and `test` are plain
PyTorch loops.
"""

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Net(nn.Module):
    """A small CNN (the classic LeNet-style network of PyTorch's 60-minute blitz)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class Rows(Dataset):
    """Rows of `{"img": tensor, "label": int}`, as a Hugging Face dataset with transforms gives them."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"img": self.images[i], "label": int(self.labels[i])}


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    """This partition's train and test DataLoaders (an IID share of the digits, 80/20)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)
    x, y = (x - 0.5) / 0.5, torch.tensor(digits.target)
    order = np.random.default_rng(42).permutation(len(y))
    mine = order[partition_id::num_partitions]
    cut = int(0.8 * len(mine))
    train, test = Rows(x[mine[:cut]], y[mine[:cut]]), Rows(x[mine[cut:]], y[mine[cut:]])
    return DataLoader(train, batch_size=batch_size, shuffle=True), DataLoader(test, batch_size=batch_size)


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set; the mean batch loss."""
    net.to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images, labels = batch["img"].to(device), batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net, testloader, device):
    """The model's mean batch loss and accuracy on the test set."""
    net.to(device)
    criterion = nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    net.eval()
    with torch.no_grad():
        for batch in testloader:
            images, labels = batch["img"].to(device), batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (outputs.argmax(1) == labels).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)
