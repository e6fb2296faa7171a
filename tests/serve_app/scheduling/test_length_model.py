import random

from serve_app.scheduling.length_model import OnlineLengthModel
from serve_app.scheduling.prompt_features import SamplingSummary, describe

TOPICS = ["rivers", "tea", "bridges", "owls", "glass", "trains", "salt", "maps", "bees", "clocks"]


def features(text):
    return describe((("user", text),), None, SamplingSummary()).features


def test_it_learns_a_separable_signal_from_the_prompt_words():
    rng = random.Random(0)
    model = OnlineLengthModel(hash_bits=12, learning_rate=0.1, prior_tokens=256)
    for _ in range(300):
        topic = rng.choice(TOPICS)
        if rng.random() < 0.5:
            model.observe(features(f"Is {topic} older than {rng.randint(1, 99)} years? Answer yes or no."), 2)
        else:
            model.observe(features(f"Write a detailed essay about {topic}, at least {rng.randint(5, 9)} pages."), 600)
    assert model.samples == 300
    assert model.predict(features("Is sand older than 40 years? Answer yes or no.")) < 10
    assert model.predict(features("Write a detailed essay about sand, at least 6 pages.")) > 300


def test_memory_is_fixed_and_one_outlier_moves_it_a_bounded_step():
    model = OnlineLengthModel(hash_bits=10, learning_rate=0.1, prior_tokens=100)
    size = model.nbytes()
    prompt = features("What is two plus two?")
    for _ in range(50):
        model.observe(prompt, 3)
    before = model.predict(prompt)
    model.observe(prompt, 10**9)
    assert model.nbytes() == size == 2 * 4 * 1024
    assert before < model.predict(prompt) < before * 20
    for i in range(2000):
        model.observe(features(f"distinct prompt {i} " + "x" * i), 5)
    assert model.nbytes() == size
