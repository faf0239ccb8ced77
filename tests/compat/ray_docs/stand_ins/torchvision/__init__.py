"""A stand-in for the few torchvision names Ray's PyTorch quickstart uses.

torchvision is not installed on this project's machines, and FashionMNIST cannot be
downloaded there (no network). The quickstart test puts this folder on ``PYTHONPATH`` so
that the quickstart's own ``from torchvision... import ...`` lines run unchanged:

* ``models.resnet18(num_classes)``: a small CNN with ResNet's attribute layout where the
  quickstart touches it (``conv1``, replaced by the script, and ``fc``);
* ``datasets.FashionMNIST(root, train, download, transform)``: 256 deterministic 28x28
  grayscale images with labels 0-9 (a pattern per class plus noise);
* ``transforms.ToTensor``, ``Normalize``, ``Compose``: as torchvision defines them for
  this input (a uint8 HxW array becomes a float 1xHxW tensor in [0, 1]).
"""
