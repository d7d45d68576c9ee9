"""A CPU stand-in for nvImageCodec's decoder, for the GPU-decoding tests on machines without a GPU."""

from __future__ import annotations

import cv2
import numpy as np


class CPUStandIn:
    """nvImageCodec's ``Decoder.decode(list_of_bytes)`` shape, on the CPU: HWC uint8 arrays, or
    ``None`` where it cannot decode (as the library answers). ``refuse``: inputs to answer None to."""

    def __init__(self, channels: int = 3, refuse: int = 0) -> None:
        self.flag = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR_RGB
        self.refuse = refuse
        self.calls: list[int] = []

    def decode(self, blobs: list[bytes]) -> list[np.ndarray | None]:
        self.calls.append(len(blobs))
        out = []
        for blob in blobs:
            if self.refuse:
                self.refuse -= 1
                out.append(None)
            else:
                out.append(cv2.imdecode(np.frombuffer(blob, np.uint8), self.flag))
        return out
