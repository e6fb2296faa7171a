import pytest

from serve_app.config import TemplateConfig
from serve_app.openai.templates import PromptTemplate, TemplateError, TemplateRegistry


def registry() -> TemplateRegistry:
    return TemplateRegistry(
        {
            "capital": TemplateConfig(prompt="What is the capital of {country}?"),
            "brief": TemplateConfig(system="Talk about {topic}.", prompt="{{literal}} {text}"),
        }
    )


def test_renders_prompt_and_system():
    rendered = registry().render("brief", {"topic": "cats", "text": "hello"})
    assert rendered.system == "Talk about cats."
    assert rendered.prompt == "{literal} hello"


def test_non_string_params_are_stringified():
    assert registry().render("capital", {"country": 42}).prompt == "What is the capital of 42?"


def test_unknown_template_lists_known_ones():
    with pytest.raises(TemplateError, match=r"unknown template 'nope' \(known: brief, capital\)") as info:
        registry().render("nope", {})
    assert info.value.param == "template"


def test_missing_params_are_named():
    with pytest.raises(TemplateError, match="missing params: text, topic") as info:
        registry().render("brief", {})
    assert info.value.param == "params"


def test_unexpected_params_are_named():
    with pytest.raises(TemplateError, match="no params named: extra"):
        registry().render("capital", {"country": "x", "extra": "y"})


@pytest.mark.parametrize("text", ["{a.b}", "{a[0]}", "{a!r}", "{a:>10}", "{0}", "{}", "{unclosed"])
def test_unsafe_or_malformed_placeholders_are_refused(text):
    with pytest.raises(ValueError, match="template 't'"):
        PromptTemplate("t", TemplateConfig(prompt=text))


def test_param_values_are_not_reinterpreted_as_placeholders():
    rendered = registry().render("capital", {"country": "{country}"})
    assert rendered.prompt == "What is the capital of {country}?"
