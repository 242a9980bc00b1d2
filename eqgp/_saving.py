"""Saving and loading models with a header that describes their structure, so that loading
into a template of another structure (another kernel class, other shapes) fails clearly
instead of filling the wrong fields."""

import json
import pathlib

import equinox as eqx
import jax
import numpy as np

_MAGIC = b"eqgp-model 1\n"


def _describe(model) -> dict:
    leaves, treedef = jax.tree.flatten(model)
    arrays = [(list(np.shape(x)), str(np.asarray(x).dtype)) for x in leaves if eqx.is_array(x)]
    return {"structure": str(treedef), "arrays": arrays}


def save(path, model) -> None:
    """Write `model` (any Equinox module or pytree, e.g. a trained `GaussianProcess`) to
    `path`: a header describing its structure (classes, static fields, array shapes and
    dtypes), then its leaves by `eqx.tree_serialise_leaves`.

    **Arguments:** `path`, a file name; `model`, the pytree to save.
    """
    header = json.dumps(_describe(model)).encode()
    with open(pathlib.Path(path), "wb") as f:
        f.write(_MAGIC)
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        eqx.tree_serialise_leaves(f, model)


def load(path, like):
    """Read a model written by `eqgp.save` into the structure of `like` (a model built the
    same way, e.g. with the same kernel classes and shapes; its values are replaced).

    **Arguments:** `path`, the file; `like`, the template.

    **Returns:** the loaded model. Raises `ValueError` naming the first difference where
    the file's model and `like` differ in structure, class, static fields or array shapes.
    """
    with open(pathlib.Path(path), "rb") as f:
        if f.read(len(_MAGIC)) != _MAGIC:
            raise ValueError(f"`path` {str(path)!r} is not a model written by eqgp.save.")
        n = int.from_bytes(f.read(8), "little")
        try:
            saved = json.loads(f.read(n).decode())
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(
                f"`path` {str(path)!r} is damaged: its header does not read back ({e}); was the file cut short?"
            ) from None
        here = _describe(like)
        if saved["structure"] != here["structure"]:
            raise ValueError(
                "`like` does not have the structure of the saved model (another kernel class, another "
                f"number of noise groups, other static settings?).\n  saved: {saved['structure'][:600]}\n"
                f"  like:  {here['structure'][:600]}"
            )
        for i, (a, b) in enumerate(zip(saved["arrays"], here["arrays"])):
            if a != [list(b[0]), b[1]]:
                raise ValueError(
                    f"`like`'s array {i} has shape {tuple(b[0])} and dtype {b[1]}; the saved model's has shape "
                    f"{tuple(a[0])} and dtype {a[1]} (e.g. ARD lengthscales of another length)."
                )
        try:
            return eqx.tree_deserialise_leaves(f, like)
        except Exception as e:  # noqa: BLE001 - numpy's message on a short read names no file
            raise ValueError(
                f"`path` {str(path)!r} is damaged: its arrays do not read back ({type(e).__name__}: "
                f"{str(e)[:200]}); was the file cut short?"
            ) from None
