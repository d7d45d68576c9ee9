"""How to install one of packer's optional extras (``gpu``, ``ray``, ``remote``, ``text``,
``bench``), as error messages say it.

packer is installed from its source checkout (README, *Set-up*); the PyPI project named
``packer`` is someone else's, so ``pip install 'packer[gpu]'`` outside the checkout installs the
wrong thing. The hint names this checkout when packer runs from one (an editable install)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["install_hint"]


def install_hint(extra: str) -> str:
    """``pip install -e '/path/to/packer[extra]'`` for this checkout; elsewhere the same from
    packer's source folder."""
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file() and (root / "packer").is_dir():
        return f"pip install -e '{root}[{extra}]'"
    return f"pip install -e 'PATH[{extra}]' with PATH packer's source checkout (PyPI's 'packer' is another project)"
