import c2c


def test_public_surface_is_pinned():
    # Adding or removing a public name is an API change: update this list on purpose.
    assert sorted(c2c.__all__) == sorted([
        "Agent", "Artifact", "ArtifactHeader", "C2CError", "Decision", "Fingerprint", "Handoff", "HandoffPolicy",
        "KVCache", "PrefixRef", "Runtime", "Settings", "SharedPrefix", "Team", "decide", "hand_off", "load_model",
        "open_store", "settings", "__version__",
    ])
    for name in c2c.__all__:
        assert getattr(c2c, name) is not None


def test_every_error_derives_from_c2c_error_and_is_documented():
    import inspect

    from c2c import errors

    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(classes) > 20
    for cls in classes:
        assert issubclass(cls, c2c.C2CError)
        assert cls.__name__ in errors.__doc__, f"{cls.__name__} missing from the tree in errors.py"


def test_import_is_lazy():
    import subprocess
    import sys

    code = "import sys, c2c; print('transformers' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
