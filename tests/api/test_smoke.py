"""End-to-end smoke: the extension imports and both real models parse."""

import pyllama
from pyllama import _core


def test_models_load(real_model_path):
    f = pyllama.GGUFFile(real_model_path)
    assert f.version == 3
    m = _core.Model([str(real_model_path)])
    assert m.arch == f.metadata["general.architecture"]
    hp = m.hparams()
    assert hp["n_layer"] == f.metadata[f"{m.arch}.block_count"]
