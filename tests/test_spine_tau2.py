"""τ² as the benchmark defines it: whole instructions, a user simulator when configured, reward by reward_basis."""
from __future__ import annotations

import pytest

from agenttune_lib.events import EventKind
from agenttune_lib.spine import Action, ReActStrategy, Tau2RetailHarness, load_tau2_tasks, run_episode
from agenttune_lib.spine.tau2 import SOLO, USER_SIMULATOR, communicate_score, gold_equals_initial, replay_actions, db_hash, fresh_db
from agenttune_lib.spine.tau2_user import STOP_TOKENS, Tau2UserSimulator
from _spine_helpers import Scripted, call


def _replay(harness, task, final="Done."):
    harness.reset(task)
    for action in task.actions:
        harness.step(Action.call(action["name"], action.get("arguments") or {}))
    return harness.step(Action.answer(final))


def test_tasks_keep_the_whole_customer_instruction():
    task = load_tau2_tasks("all", ids=["0"])[0]
    text = task.instruction
    for part in (task.reason_for_call, task.known_info, task.unknown_info, task.task_instructions):
        assert part.strip() and part.strip() in text
    assert "detail-oriented" in text and text.startswith("Domain: retail")
    assert task.reward_basis == ("DB", "NL_ASSERTION")
    row = task.to_row()
    assert row["instruction"] == text and row["reward_basis"] == ["DB", "NL_ASSERTION"]


def test_solo_is_the_named_default_and_the_report_says_what_was_checked():
    task = next(t for t in load_tau2_tasks("all") if t.nl_assertions)
    harness = Tau2RetailHarness(max_steps=len(task.actions) + 2)
    assert harness.mode == SOLO
    _replay(harness, task, final=" ".join(task.communicate_info) or "Done.")
    log = harness.to_eventlog()
    report = log.metadata["reward_report"]
    assert log.rewards("episode") == [1.0]
    assert report["mode"] == "solo" and report["basis"] == list(task.reward_basis)
    assert report["checked"] == ["DB"] and report["unchecked"] == ["NL_ASSERTION"]
    assert "need a judge" in report["notes"]["NL_ASSERTION"]
    assert report["components"]["DB"] == 1.0


def test_an_nl_judge_makes_assertions_count():
    task = next(t for t in load_tau2_tasks("all") if t.nl_assertions)
    seen = {}

    def judge(assertions, transcript):
        seen["assertions"] = assertions
        return [False for _ in assertions]

    harness = Tau2RetailHarness(max_steps=len(task.actions) + 2, nl_judge=judge)
    _replay(harness, task)
    report = harness.to_eventlog().metadata["reward_report"]
    assert seen["assertions"] == list(task.nl_assertions)
    assert report["checked"] == ["DB", "NL_ASSERTION"] and report["reward"] == 0.0


def test_tasks_without_assertions_pass_nl_vacuously_and_db_decides():
    task = next(t for t in load_tau2_tasks("train") if not t.nl_assertions and not gold_equals_initial(t))
    harness = Tau2RetailHarness(max_steps=3)
    harness.reset(task)
    harness.step(Action.answer("I did nothing."))
    report = harness.to_eventlog().metadata["reward_report"]
    assert report["reward"] == 0.0 and report["components"]["DB"] == 0.0 and report["unchecked"] == []


def test_communicate_info_is_checked_deterministically():
    task = next(t for t in load_tau2_tasks("all") if t.communicate_info)
    assert communicate_score(task, ["nothing useful"]) == 0.0
    assert communicate_score(task, ["Here you go: " + " and ".join(task.communicate_info)]) == 1.0


def test_tasks_whose_gold_state_is_the_initial_state_are_flagged():
    flagged = [t for t in load_tau2_tasks("all") if gold_equals_initial(t)]
    assert flagged, "the retail data has read-only tasks"
    for task in flagged:
        assert db_hash(replay_actions(task.actions)) == db_hash(fresh_db())
    harness = Tau2RetailHarness(max_steps=2)
    harness.reset(flagged[0])
    harness.step(Action.answer("Nothing to do."))
    log = harness.to_eventlog()
    assert log.metadata["gold_equals_initial"] is True and log.metadata["reward_report"]["gold_equals_initial"] is True


def test_user_simulator_plays_the_customer_from_the_whole_instruction():
    task = load_tau2_tasks("all", ids=["0"])[0]
    user_inputs = []

    def customer_model(messages):
        user_inputs.append(messages)
        turn = sum(1 for m in messages if m["role"] == "assistant")
        return ["Hi, I want to exchange two items from order #W2378156.", "I am Yusuf Rossi, zip 19122.", STOP_TOKENS[0]][min(turn, 2)]

    harness = Tau2RetailHarness(max_steps=8, user=Tau2UserSimulator(customer_model))
    assert harness.mode == USER_SIMULATOR and "No further customer messages" not in harness.instructions
    agent = Scripted(["Could you tell me your name and zip code?", call("find_user_id_by_name_zip", first_name="Yusuf", last_name="Rossi", zip="19122"), "Thanks, I found you."])
    log = run_episode(ReActStrategy(agent), harness, task)
    # the simulator's system prompt carries every part of the customer-side instruction
    system = user_inputs[0][0]["content"]
    for part in (task.reason_for_call, task.known_info, task.unknown_info, task.task_instructions):
        assert part.strip() in system
    # the agent saw the simulated customer's turns as user messages, and the episode went past its first answer
    observations = [e.payload["content"] for e in log if e.kind is EventKind.OBSERVATION]
    assert observations[:2] == ["Hi, I want to exchange two items from order #W2378156.", "I am Yusuf Rossi, zip 19122."]
    assert agent.seen[1][-1] == {"role": "user", "content": "I am Yusuf Rossi, zip 19122."}
    assert [e.payload.get("content") for e in log if e.kind is EventKind.TEXT] == ["Could you tell me your name and zip code?", "Thanks, I found you."]
    assert observations[-1] == STOP_TOKENS[0] and log[-1].kind is EventKind.TURN_COMPLETE
    assert log.metadata["user_mode"] == USER_SIMULATOR and log.metadata["reward_report"]["mode"] == USER_SIMULATOR
    # the agent's messages are the simulator's user turns
    assert user_inputs[1][-1] == {"role": "user", "content": "Could you tell me your name and zip code?"}


def test_user_simulator_over_an_openai_compatible_endpoint():
    from _chat_stub import chat_endpoint

    def reply(body):
        text = "I need to return an item." if len(body["messages"]) < 3 else STOP_TOKENS[0]
        return {"choices": [{"message": {"role": "assistant", "content": text}}], "model": body["model"]}

    with chat_endpoint(reply) as (url, seen):
        sim = Tau2UserSimulator.openai(url, "customer-model", api_key_env=None)
        opening = sim.start(load_tau2_tasks("all", ids=["0"])[0])
        assert opening == "I need to return an item."
        assert sim.reply("Sure, which one?") == (STOP_TOKENS[0], True)
    assert seen[0]["body"]["model"] == "customer-model" and "Yusuf Rossi" in seen[0]["body"]["messages"][0]["content"]


def test_bad_simulator_settings_are_clear_errors():
    with pytest.raises(ValueError, match="max_turns must be a positive integer"):
        Tau2UserSimulator(lambda m: "x", max_turns=0)
    with pytest.raises(TypeError, match="needs a model callable"):
        Tau2UserSimulator("not a model")


def test_nl_assertion_judge_over_a_model_scores_the_episode():
    from agenttune_lib.spine.tau2_user import nl_assertion_judge

    task = next(t for t in load_tau2_tasks("all") if t.nl_assertions)
    prompts = []

    def judge_model(messages):
        prompts.append(messages[-1]["content"])
        said = "10 t-shirt options" in messages[-1]["content"].split("Assertions:")[0]
        return '{"verdicts": [' + ", ".join(["true" if said else "false"] * len(task.nl_assertions)) + "]}"

    for final, expected in (("There are 10 t-shirt options available.", 1.0), ("Done.", 0.0)):
        harness = Tau2RetailHarness(max_steps=len(task.actions) + 2, nl_judge=nl_assertion_judge(judge_model))
        _replay(harness, task, final=final)
        report = harness.to_eventlog().metadata["reward_report"]
        assert report["checked"] == ["DB", "NL_ASSERTION"]
        assert report["components"]["NL_ASSERTION"] == expected and report["reward"] == expected
    assert task.nl_assertions[0] in prompts[0]
    with pytest.raises(ValueError, match="not \\{\"verdicts\""):
        nl_assertion_judge(lambda m: "yes")(["a"], [])
    with pytest.raises(ValueError, match="expected that many booleans"):
        nl_assertion_judge(lambda m: '{"verdicts": [true]}')(["a", "b"], [])


def test_cli_tasks_shows_reward_basis_and_flags():
    from typer.testing import CliRunner

    from agenttune_lib.cli.spine import app

    out = CliRunner().invoke(app, ["tasks", "--split", "all", "--limit", "114"])
    assert out.exit_code == 0, out.output
    assert "DB+NL_ASSERTION" in out.output and "yes" in out.output


def test_restore_rewinds_the_simulated_customer_too():
    task = load_tau2_tasks("all", ids=["0"])[0]
    replies = iter(["Hello, I want an exchange.", "My zip is 19122.", "Actually, cancel that."])
    harness = Tau2RetailHarness(max_steps=6, user=Tau2UserSimulator(lambda messages: next(replies)))
    harness.reset(task)
    blob = harness.snapshot()
    before = harness.state_fingerprint()
    harness.step(Action.answer("What is your zip code?"))
    assert harness.state_fingerprint() != before
    harness.restore(blob)
    assert harness.state_fingerprint() == before
    assert [m["content"] for m in harness.user.history] == ["Hi! How can I help you today?", "Hello, I want an exchange."]
