"""``Loader(ds, 64, num_workers=4)`` or ``pin_memory=True`` (a DataLoader's or FFCV's argument)
raised Python's plain "unexpected keyword argument": now a one-line TypeError names the Loader's
own argument; none is accepted silently."""

from __future__ import annotations

import numpy as np
import pytest

from readers import Loader
from readers.foreign_args import FOREIGN

SAMPLES = [(np.full((3, 4, 4), i, np.uint8), i % 2) for i in range(8)]


@pytest.mark.parametrize("name, value, pointer", [
    ("num_workers", 4, "use threads="),
    ("pin_memory", True, "use device='cuda'"),
    ("prefetch_factor", 2, "use prefetch="),
    ("collate_fn", list, "none, batches are uint8 (N, C, H, W) tensors"),
    ("persistent_workers", True, "none, the Loader has no worker processes"),
    ("order", "random", "use shuffle=True (OrderOption.RANDOM)"),
    ("os_cache", True, "readers.RAMDataset(path)"),
    ("batches_ahead", 3, "use prefetch="),
    ("distributed", True, "use rank=/world_size="),
])
def test_a_dataloader_or_ffcv_argument_names_the_loaders_own(name: str, value: object, pointer: str) -> None:
    with pytest.raises(TypeError) as caught:
        Loader(SAMPLES, 4, shuffle=False, **{name: value})
    message = str(caught.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"Loader({name}={value!r}): a torch DataLoader / FFCV argument, not Loader's: "), message
    assert pointer in message, message


def test_every_pointer_is_refused_and_other_names_get_pythons_own_error() -> None:
    for name in FOREIGN:
        with pytest.raises(TypeError, match=rf"^Loader\({name}="):
            Loader(SAMPLES, 4, **{name: None})
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        Loader(SAMPLES, 4, bogus=1)
    loader = Loader(SAMPLES, 4, shuffle=False, drop_last=True, threads=1, prefetch=1)  # the Loader's own still work
    assert [labels.tolist() for _, labels in loader] == [[0, 1, 0, 1], [0, 1, 0, 1]]
