from serve_app.config import PredictorConfig
from serve_app.scheduling.predictor import LengthPredictor, Prediction, PromptClass
from serve_app.scheduling.prompt_features import SamplingSummary, describe

CAPITAL = PromptClass("chat", "capital", 40)


def test_cold_start_uses_max_tokens_else_the_configured_default():
    predictor = LengthPredictor(PredictorConfig(cold_start_tokens=300, min_samples=3))
    assert predictor.predict(CAPITAL, 50).tokens == 50
    prediction = predictor.predict(CAPITAL, None)
    assert (prediction.tokens, prediction.source) == (300, "cold_start")


def test_history_takes_over_after_min_samples_capped_by_max_tokens():
    predictor = LengthPredictor(PredictorConfig(min_samples=3, quantile=0.9))
    for tokens in (10, 12, 30):
        assert predictor.predict(CAPITAL, 500).source == "max_tokens"
        predictor.observe(CAPITAL, tokens)
    # the 0.9 quantile of (10, 12, 30), interpolated (26.4), rounded up to whole tokens
    assert predictor.predict(CAPITAL, 500).tokens == 27
    assert predictor.predict(CAPITAL, 500).source == "history"
    assert predictor.predict(CAPITAL, 20).tokens == 20


def test_classes_are_kept_apart_and_the_window_forgets():
    predictor = LengthPredictor(PredictorConfig(min_samples=1, window=2, quantile=1.0))
    other = PromptClass("chat", None, 40)
    predictor.observe(CAPITAL, 100)
    predictor.observe(CAPITAL, 5)
    predictor.observe(CAPITAL, 6)
    assert predictor.predict(CAPITAL, None).tokens == 6  # the 100 fell out of the window
    assert predictor.predict(other, None).source == "cold_start"
    assert PromptClass("chat", None, 40).key() == PromptClass("chat", None, 63).key() != PromptClass("chat", None, 64).key()


def test_one_tenant_flooding_a_class_with_long_outputs_leaves_anothers_prediction_alone():
    predictor = LengthPredictor(PredictorConfig(min_samples=3, quantile=0.9))
    for _ in range(3):
        predictor.observe(CAPITAL, 10, "beta")
    for _ in range(500):
        predictor.observe(CAPITAL, 4000, "alpha")
    assert predictor.predict(CAPITAL, None, "beta") == Prediction(10, "history")
    assert predictor.predict(CAPITAL, None, "alpha") == Prediction(4000, "history")
    assert predictor.predict(CAPITAL, None, "gamma").source == "cold_start"  # warms on its own outputs
    assert predictor.classes() == {"template:capital": 3 + 256}  # summed, no tenant named


def test_memory_stays_bounded_under_many_tenants_and_classes_least_recently_observed_first_out():
    predictor = LengthPredictor(PredictorConfig(min_samples=1, window=4, max_histories=8))
    sizes = [PromptClass("chat", None, 2**bits) for bits in range(5)]
    for tenant in range(100):
        for prompt_class in sizes:
            for _ in range(5):
                predictor.observe(prompt_class, 7, f"t{tenant}")
        predictor.observe(sizes[0], 7, "steady")  # observed all along: never the least recent
    assert len(predictor._history) == 8 and sum(predictor.classes().values()) <= 8 * 4
    assert len(predictor._history[("steady", sizes[0].key())]) == 4  # kept whole
    assert predictor.predict(sizes[4], None, "t99").source == "history"
    assert predictor.predict(sizes[0], None, "t0").source == "cold_start"  # dropped long ago


def described(text, max_tokens=None):
    return describe((("user", text),), None, SamplingSummary(max_tokens=max_tokens))


def test_history_then_model_then_max_tokens_always_capped():
    predictor = LengthPredictor(PredictorConfig(min_samples=3, model_min_samples=4, quantile=0.5))
    asked = described("Translate to French: good morning")
    assert predictor.predict(asked, 40) == Prediction(40, "max_tokens")
    assert predictor.predict(asked, None) == Prediction(256, "cold_start")
    for n in range(4):
        predictor.observe(described(f"Summarise chapter {'abcd'[n]} of the book"), 300)
    assert predictor.predict(asked, None).source == "model"  # a fifth prompt, never seen: the model answers
    for _ in range(3):
        predictor.observe(asked, 9)
    assert predictor.predict(asked, None) == Prediction(9, "history")
    assert predictor.predict(described("Translate to French: good evening"), 500).source == "model"
    assert predictor.predict(described("Summarise chapter z of the book"), 50) == Prediction(50, "max_tokens")
    assert predictor.classes() == {"fp:*": 7}


def test_a_tenants_flood_moves_no_other_tenants_predictions():
    predictor = LengthPredictor(PredictorConfig(min_samples=4, model_min_samples=8))
    prompts = [described(f"Give one word for colour {c}") for c in "abcdefgh"]
    for prompt in prompts:
        predictor.observe(prompt, 2, "beta")
        predictor.observe(prompt, 2, "beta")
    before = [predictor.predict(p, 1000, "beta") for p in [*prompts, described("Write an essay on rain")]]
    for i in range(3000):  # alpha floods the same prompts and more, with long answers
        predictor.observe(prompts[i % 8], 900, "alpha")
        predictor.observe(described(f"Give one word for thing {i}"), 900, "alpha")
    after = [predictor.predict(p, 1000, "beta") for p in [*prompts, described("Write an essay on rain")]]
    assert after == before and before[0].tokens < 20 and before[-1].source == "model"
    assert predictor.predict(prompts[0], 1000, "alpha").tokens >= 900


def test_memory_stays_bounded_over_many_tenants_and_fingerprints():
    config = PredictorConfig(min_samples=1, window=4, max_histories=64, max_models=3, hash_bits=10)
    predictor = LengthPredictor(config)
    for tenant in range(40):
        for prompt in range(30):
            predictor.observe(described(f"Question {'xyz'[prompt % 3]}{prompt}"), 5, f"t{tenant}")
    assert len(predictor._history) == 64 and sum(predictor.classes().values()) <= 64 * 4
    assert len(predictor._models) == 3 and predictor.nbytes() == 3 * 2 * 4 * 2**10
    assert predictor.predict(described("Question anything"), None, "t0").source == "cold_start"  # dropped
    assert predictor.predict(described("Question x0"), None, "t39").source == "history"


def test_models_can_be_turned_off():
    predictor = LengthPredictor(PredictorConfig(model_min_samples=1, max_models=0))
    predictor.observe(described("one"), 3)
    assert predictor.predict(described("two"), None).source == "cold_start" and predictor.nbytes() == 0
