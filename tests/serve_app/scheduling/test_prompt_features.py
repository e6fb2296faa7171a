from serve_app.scheduling.prompt_features import FINGERPRINT_WORDS, SamplingSummary, describe, fingerprint, normalise

PLAIN = SamplingSummary()


def chat(*messages, sampling=PLAIN, model=None):
    return describe(messages, None, sampling, model)


def test_normalising_drops_case_digits_and_spacing():
    assert normalise("  Translate   ticket 4512\n to FRENCH ") == "translate ticket 0 to french"
    assert fingerprint("You are terse.", "Summarise report #17:  revenue up") == \
        fingerprint("you are  TERSE.", "summarise report #203: revenue\tup")
    assert fingerprint("", "Summarise the report") != fingerprint("", "Translate the report")
    assert fingerprint("You are terse.", "Summarise") != fingerprint("You are verbose.", "Summarise")


def test_the_fingerprint_reads_the_leading_words_of_the_last_user_message():
    lead = " ".join(f"w{chr(97 + i)}" for i in range(FINGERPRINT_WORDS))  # digits would normalise alike
    same = chat(("user", "earlier question"), ("assistant", "answer"), ("user", lead + " tail one"))
    assert same.fingerprint == chat(("user", lead + " a different tail")).fingerprint
    assert same.fingerprint != chat(("user", "first " + lead)).fingerprint


def test_features_see_structure_sampling_and_model_and_stay_bounded():
    base = chat(("user", "What is the capital of France?"))
    assert base.kind == "chat" and base.prompt_chars == len("What is the capital of France?")
    for other in (chat(("system", "Be brief."), ("user", "What is the capital of France?")),
                  chat(("user", "What is the capital of France?"), sampling=SamplingSummary(max_tokens=5)),
                  chat(("user", "What is the capital of France?"), sampling=SamplingSummary(stop=("\n",))),
                  chat(("user", "What is the capital of France?"), model="big")):
        assert set(other.features) != set(base.features)
    huge = chat(("user", "word " * 200_000))
    assert len(huge.features) < 200 and huge.prompt_chars == 1_000_000
    completion = describe(None, "Once upon a time", PLAIN)
    assert completion.kind == "completion" and completion.features and completion.fingerprint


def test_history_key_is_the_template_else_the_fingerprint():
    templated = describe((("user", "What is the capital of Peru?"),), None, PLAIN, template="capital")
    assert templated.history_key() == "template:capital"
    plain = chat(("user", "What is the capital of Peru?"))
    assert plain.history_key() == f"fp:{plain.fingerprint}"
    assert plain.key() == "chat:2^4"  # the coarse class is kept for baselines
