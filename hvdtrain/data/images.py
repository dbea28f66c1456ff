"""Image folders in torchvision's ImageFolder layout, read with Pillow (no torchvision needed):

    ROOT/train/CLASS/*.png  and  ROOT/val/CLASS/*.png     (or ROOT/CLASS/*.png, split by val_fraction)

Classes are the sorted folder names. Training images get a random horizontal flip and a random
crop after padding (the usual light augmentation); every image is resized to image_size x image_size
and normalised per channel with ImageNet's mean and std, so pretrained zoo models fit.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from hvdtrain.errors import UserError

EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def scan(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """(classes, [(file, class index)]) of an ImageFolder-layout folder."""
    if not root.is_dir():
        raise UserError(f"image folder {root} does not exist")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise UserError(f"image folder {root} has no class folders (expected {root}/CLASS/image.png)")
    samples = [(f, i) for i, name in enumerate(classes) for f in sorted((root / name).rglob("*"))
               if f.suffix.lower() in EXTENSIONS]
    if not samples:
        raise UserError(f"image folder {root} holds no images ({', '.join(EXTENSIONS)})")
    return classes, samples


class ImageFolder(Dataset):
    """Args:
        samples: [(file, class index)] (see scan).
        size: images are resized to size x size.
        train: augment (random flip and crop); a generator seeded per loader worker makes it reproducible.
    """

    def __init__(self, samples: list[tuple[Path, int]], size: int, train: bool) -> None:
        self.samples, self.size, self.train = samples, size, train

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.samples[index]
        try:
            with Image.open(path) as image:
                pixels = image.convert("RGB").resize((self.size, self.size), Image.Resampling.BILINEAR)
                data = torch.frombuffer(bytearray(pixels.tobytes()), dtype=torch.uint8)
        except OSError as err:
            raise UserError(f"cannot read image {path}: {err}") from None
        x = data.view(self.size, self.size, 3).permute(2, 0, 1).float() / 255.0
        if self.train:
            if torch.rand(()) < 0.5:
                x = x.flip(2)
            pad = max(1, self.size // 8)
            padded = torch.nn.functional.pad(x, (pad, pad, pad, pad), mode="reflect")
            top, left = torch.randint(0, 2 * pad + 1, (2,)).tolist()
            x = padded[:, top:top + self.size, left:left + self.size]
        return (x - MEAN) / STD, label


def image_folder(root: str, size: int, val_fraction: float, seed: int) -> tuple[ImageFolder, ImageFolder, int]:
    """(train, val, number of classes) from ROOT/train + ROOT/val, or ROOT split by val_fraction."""
    base = Path(root)
    if (base / "train").is_dir():
        classes, train = scan(base / "train")
        if not (base / "val").is_dir():
            raise UserError(f"image folder {base} has train/ but no val/; add val/CLASS/... or drop train/")
        val_classes, val = scan(base / "val")
        if val_classes != classes:
            raise UserError(f"image folder {base}: val/ classes {val_classes} differ from train/ classes {classes}")
    else:
        classes, everything = scan(base)
        order = torch.randperm(len(everything), generator=torch.Generator().manual_seed(seed)).tolist()
        n_val = max(1, round(len(everything) * val_fraction))
        val = [everything[i] for i in sorted(order[:n_val])]
        train = [everything[i] for i in sorted(order[n_val:])]
    return ImageFolder(train, size, train=True), ImageFolder(val, size, train=False), len(classes)
