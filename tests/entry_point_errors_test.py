"""Every entry point's answer to each input mistake: exit code 78 and one line; a bug: a traceback.

Each `launch.*` entry point runs as a subprocess on the mistakes that reach it (`launch.export`
reads no data file, `launch.plan` neither data nor tokenizer, `launch.judge` no model: they get
the mistakes of the inputs they read); `--help` exits 0. The classification itself (`agentic_grpo.errors`) and the held startup logs
(`launch.common_flags.HeldLogs`) are tested in process.
"""

import concurrent.futures
import json
import logging as std_logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from absl import logging
from absl.testing import absltest
from absl.testing import parameterized

from agentic_grpo import config as config_lib
from agentic_grpo import config_drift
from agentic_grpo import errors
from agentic_grpo import exit_codes
from agentic_grpo import train
from agentic_grpo.checkpoint import checkpointer
from agentic_grpo.checkpoint import run_lock
from agentic_grpo.tasks import finite
from agentic_grpo.tasks import loading
from agentic_grpo.train import components
from agentic_grpo.train import eval_only
from launch import common_flags
from tests.fixtures import chat_checkpoint
from tests.fixtures import xla_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
SUM = "a, b = map(int, input().split())\nprint(a + b)\n"


def _codecontests_rows(n: int) -> list[dict]:
  return [{"name": f"sum{i}", "description": "Print a + b.",
           "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
           "private_tests": {"input": ["5 7\n", "-1 1\n"], "output": ["12\n", "0\n"]},
           "time_limit": {"seconds": 1, "nanos": 0}, "memory_limit_bytes": 268435456,
           "solutions": {"language": [3], "solution": [SUM]}} for i in range(n)]


def _env() -> dict:
  return xla_flags.child_env(PYTHONPATH=str(ROOT))


def _launch(module: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", f"launch.{module}", *args], cwd=ROOT,
                        env=_env(), capture_output=True, text=True, timeout=300, check=False)


# Runs an entry point as `python -m` would, with one function replaced by one that raises a
# plain ValueError: a bug, not an input mistake.
_WITH_BUG = """
import runpy, sys
from unittest import mock
target, module, args = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.argv = [module] + args
with mock.patch(target, side_effect=ValueError("an injected bug")):
  runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def _launch_with_bug(target: str, module: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", _WITH_BUG, target, f"launch.{module}", *args],
                        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
                        check=False)


_STDIO = ("--config.task.source=stdio",)
# Mistake -> (command-line arguments with {names} of the fixture's paths, the error's pattern).
_RUN_MISTAKES = {
    "missing_data_path": (_STDIO + ("--config.task.path={tmp}/nonexistent.jsonl",),
                          r"config\.task\.path '.*nonexistent\.jsonl' \(stdio JSONL file\) is "
                          r"missing: set --config\.task\.path"),
    "missing_model_directory": (("--config.model.source=hf",
                                 "--config.model.path={tmp}/nonexistent_model"),
                                r"config\.model\.path '.*nonexistent_model' is not a "
                                r"directory: set --config\.model\.path"),
    "missing_tokenizer_json": (("--config.model.source=hf", "--config.model.path={no_tokenizer}"),
                               r"has no tokenizer\.json: copy the checkpoint's tokenizer files"),
    "unsupported_architecture": (("--config.model.source=hf", "--config.model.path={mistral}"),
                                 r"unsupported architecture 'MistralForCausalLM'; supported: "),
    "architectures_disagree_with_model_type": (
        ("--config.model.source=hf", "--config.model.path={disagree}"),
        r"architectures \['Qwen2ForCausalLM'\] \(family 'qwen2'\) and model_type 'llama' "
        r"disagree"),
    "max_seq_len_past_max_position_embeddings": (
        ("--config.model.source=hf", "--config.model.path={model}",
         "--config.model.max_seq_len=2048"),
        r"config\.model\.max_seq_len=2048 exceeds the checkpoint's "
        r"max_position_embeddings=1024"),
    "layout_mismatch": (_STDIO + ("--config.task.path={problems}",
                                  "--config.task.stdio_layout=apps"),
                        r"no usable stdio task in .*: all 3 row\(s\) are malformed .*; check "
                        r"--config\.task\.stdio_layout='apps'"),
    "empty_heldout_split": (_STDIO + ("--config.task.path={problems}",
                                      "--config.task.heldout_fraction=0.01"),
                            r"the held-out split of 3 tasks is empty .*: raise "
                            r"--config\.task\.heldout_fraction"),
    "context_too_short_for_the_buckets": (("--config.model.max_seq_len=64",),
                                          r"the model's context is too short for the buckets; "
                                          r"lower --config\.rl\.buckets"),
    "prompts_too_long_for_the_buckets": (
        _STDIO + ("--config.task.path={many_problems}", "--config.rl.buckets=(64,)",
                  "--config.warmstart.seq_len=64", "--config.workflow.max_new_tokens=48"),
        r"config\.rl\.buckets=\(64,\): .* raise --config\.rl\.buckets to at least"),
}
# What export reads: the run's workdir and the model its config.json names.
_EXPORT_MISTAKES = {
    "missing_workdir": (("--workdir={tmp}/nonexistent_run",),
                        r"workdir '.*nonexistent_run' does not exist: not a run's workdir"),
    "missing_model_directory": (("--workdir={run_missing_model_directory}",),
                                _RUN_MISTAKES["missing_model_directory"][1]),
    "missing_tokenizer_json": (("--workdir={run_missing_tokenizer_json}",),
                               _RUN_MISTAKES["missing_tokenizer_json"][1]),
    "unsupported_architecture": (("--workdir={run_unsupported_architecture}",),
                                 _RUN_MISTAKES["unsupported_architecture"][1]),
    "architectures_disagree_with_model_type": (
        ("--workdir={run_architectures_disagree_with_model_type}",),
        _RUN_MISTAKES["architectures_disagree_with_model_type"][1]),
}
# What plan reads: a config.json.
_PLAN_MISTAKES = {
    "missing_model_directory": (("--hf_config={tmp}/nonexistent_model",),
                                r"--hf_config '.*nonexistent_model': no config\.json"),
    "unsupported_architecture": (("--hf_config={mistral}",),
                                 _RUN_MISTAKES["unsupported_architecture"][1]),
    "architectures_disagree_with_model_type": (
        ("--hf_config={disagree}",), _RUN_MISTAKES["architectures_disagree_with_model_type"][1]),
}


# What judge reads: the data set and the programs file.
_JUDGE_MISTAKES = {
    **{name: _RUN_MISTAKES[name] for name in ("missing_data_path", "layout_mismatch",
                                              "empty_heldout_split")},
    "missing_programs_file": (_STDIO + ("--config.task.path={problems}",
                                        "--programs={tmp}/nonexistent_programs.jsonl"),
                              r"--programs '.*nonexistent_programs\.jsonl' is missing"),
    "unknown_task_id": (_STDIO + ("--config.task.path={problems}",
                                  "--programs={unknown_programs}"),
                        r"row 1 names task_id 'codecontests/nope', not a task of the data set"),
}


# A `--config` file that does not load (each written by `setUpClass` as `{tmp}/cfg_<name>.py`
# with this text): its error and line, in one line. Every entry point with `--config` gets them.
_CONFIG_FILES = {
    "syntax_error": "def get_config(:\n",
    "raises": "def get_config():\n  raise RuntimeError('boom')\n",
    "value_error": "def get_config():\n  raise ValueError('bad value')\n",
    "no_get_config": "X = 1\n",
    "returns_none": "def get_config():\n  return None\n",
    "returns_an_int": "def get_config():\n  return 5\n",
}
_CONFIG_MISTAKES = {
    "config_file_missing": (("--config={tmp}/no_such_config.py",),
                            r"--config=.*no_such_config\.py: no such file$"),
    "config_file_is_a_directory": (("--config={tmp}",), r"is a directory, not a config file$"),
    "config_file_syntax_error": (("--config={tmp}/cfg_syntax_error.py",),
                                 r"does not load: SyntaxError: .*cfg_syntax_error\.py, line 1\)$"),
    "config_file_raises": (("--config={tmp}/cfg_raises.py",),
                           r"does not load: RuntimeError: boom \(.*cfg_raises\.py, line 2\)$"),
    "config_file_value_error": (
        ("--config={tmp}/cfg_value_error.py",),
        r"does not load: ValueError: bad value \(.*cfg_value_error\.py, line 2\)$"),
    "config_file_without_get_config": (("--config={tmp}/cfg_no_get_config.py",),
                                       r"cfg_no_get_config\.py defines no get_config\(\)"),
    "config_file_returns_none": (("--config={tmp}/cfg_returns_none.py",),
                                 r"get_config\(\) returned None, not a ConfigDict"),
    "config_file_returns_an_int": (("--config={tmp}/cfg_returns_an_int.py",),
                                   r"get_config\(\) returned a value of type int, not a "
                                   r"ConfigDict"),
}


def _cases():
  for module in ("train", "evaluate"):
    for name, (args, pattern) in _RUN_MISTAKES.items():
      yield module, name, args, pattern
  for module in ("train", "evaluate", "judge"):
    for name, (args, pattern) in _CONFIG_MISTAKES.items():
      yield module, name, args + (("--programs={tmp}/p.jsonl",) if module == "judge" else ()), (
          pattern)
  for name, (args, pattern) in _EXPORT_MISTAKES.items():
    yield "export", name, args + ("--out={tmp}/out_" + name,), pattern
  for name, (args, pattern) in _PLAN_MISTAKES.items():
    yield "plan", name, args, pattern
  for name, (args, pattern) in _JUDGE_MISTAKES.items():
    yield "judge", name, args, pattern


CASES = [dict(testcase_name=f"{module}_{name}", module=module, name=name, args=args,
              pattern=pattern) for module, name, args, pattern in _cases()]


def _edit_config(path: str, **changes) -> None:
  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  hf.update(changes)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf, f)


class InputMistakeTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    tmp = cls.tmp
    paths = {"tmp": tmp, "model": os.path.join(tmp, "model")}
    chat_checkpoint.write_checkpoint(paths["model"], ["print(a + b)\n", "Print a + b.\n"])
    for name in ("no_tokenizer", "mistral", "disagree"):
      paths[name] = os.path.join(tmp, name)
      shutil.copytree(paths["model"], paths[name])
    os.remove(os.path.join(paths["no_tokenizer"], "tokenizer.json"))
    _edit_config(paths["mistral"], architectures=["MistralForCausalLM"], model_type="mistral")
    _edit_config(paths["disagree"], architectures=["Qwen2ForCausalLM"], model_type="llama")
    for name, n in (("problems", 3), ("many_problems", 16)):
      paths[name] = os.path.join(tmp, f"{name}.jsonl")
      with open(paths[name], "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in _codecontests_rows(n))
    for name, text in _CONFIG_FILES.items():
      with open(os.path.join(tmp, f"cfg_{name}.py"), "w") as f:
        f.write(text)
    paths["unknown_programs"] = os.path.join(tmp, "unknown_programs.jsonl")
    with open(paths["unknown_programs"], "w") as f:
      f.write(json.dumps({"task_id": "codecontests/nope", "program": SUM}) + "\n")
    # Runs whose saved config names a model that does not open (as if moved or edited since).
    for name, model in (("missing_model_directory", os.path.join(tmp, "nonexistent_model")),
                        ("missing_tokenizer_json", paths["no_tokenizer"]),
                        ("unsupported_architecture", paths["mistral"]),
                        ("architectures_disagree_with_model_type", paths["disagree"])):
      run = paths[f"run_{name}"] = os.path.join(tmp, f"run_{name}")
      os.makedirs(run)
      cfg = config_lib.from_config_dict({"model": {"source": "hf", "path": model}})
      with open(os.path.join(run, "config.json"), "w") as f:
        json.dump(config_lib.to_dict(cfg), f)
    cls.paths = paths

    def launch(case):
      args = [a.format(**paths) for a in case["args"]]
      if case["module"] in ("train", "evaluate"):
        args.append(f"--workdir={os.path.join(tmp, 'workdir_' + case['testcase_name'])}")
      return case["testcase_name"], _launch(case["module"], *args)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      cls.results = dict(pool.map(launch, CASES))

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp)
    super().tearDownClass()

  @parameterized.named_parameters(CASES)
  def test_exit_code_78_and_one_line(self, module, name, args, pattern):
    del args
    proc = self.results[f"{module}_{name}"]
    self.assertEqual(proc.returncode, exit_codes.CONFIG_ERROR, proc.stdout + proc.stderr)
    self.assertEqual(proc.stdout, "")
    lines = proc.stderr.splitlines()
    self.assertLen(lines, 1, proc.stderr)
    self.assertRegex(lines[0], "^error: .*" + pattern)
    if module in ("train", "evaluate"):  # a refused run writes nothing
      self.assertFalse(os.path.exists(os.path.join(self.tmp, f"workdir_{module}_{name}")))

  def test_mistakes_of_each_run_entry_point_are_the_listed_ones(self):
    self.assertContainsSubset(
        {"missing_data_path", "missing_model_directory", "missing_tokenizer_json",
         "unsupported_architecture", "layout_mismatch", "empty_heldout_split",
         "context_too_short_for_the_buckets"}, set(_RUN_MISTAKES))


class HelpTest(parameterized.TestCase):

  @parameterized.parameters("train", "evaluate", "export", "plan", "judge")
  def test_help_exits_0(self, module):
    proc = _launch(module, "--help")
    self.assertEqual(proc.returncode, exit_codes.OK, proc.stderr[-3000:])
    self.assertIn("--", proc.stdout)


class BugTest(parameterized.TestCase):
  """A bug (here a plain ValueError where none is expected) is a traceback and exit code 1."""

  @parameterized.named_parameters(
      ("train", "agentic_grpo.train.device.build_model", "train", ()),
      ("evaluate", "agentic_grpo.train.device.build_model", "evaluate",
       ("--config.rl.group_size=4",)),
      ("plan", "agentic_grpo.models.presets.get_model_config", "plan", ()),
      ("judge", "agentic_grpo.judging.load_tasks", "judge", ()))
  def test_traceback_and_exit_code_1(self, target, module, args):
    workdir = os.path.join(self.create_tempdir().full_path, "run")
    args = (*args, f"--workdir={workdir}") if module in ("train", "evaluate") else args
    proc = _launch_with_bug(target, module, *args)
    self.assertEqual(proc.returncode, exit_codes.CRASH, proc.stderr[-3000:])
    self.assertIn("Traceback (most recent call last)", proc.stderr)
    self.assertRegex(proc.stderr, r"(?m)^ValueError: an injected bug$")
    self.assertNotIn("error: an injected bug", proc.stderr)

  def test_export(self):
    tmp = self.create_tempdir().full_path
    model = os.path.join(tmp, "model")
    os.makedirs(model)
    cfg = config_lib.from_config_dict({"model": {"source": "hf", "path": model}})
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(config_lib.to_dict(cfg), f)
    proc = _launch_with_bug("agentic_grpo.models.sources.open_model", "export",
                            f"--workdir={tmp}", f"--out={tmp}/out")
    self.assertEqual(proc.returncode, exit_codes.CRASH, proc.stderr[-3000:])
    self.assertIn("Traceback (most recent call last)", proc.stderr)
    self.assertNotIn("error: an injected bug", proc.stderr)


class ClassificationTest(absltest.TestCase):

  def test_input_mistakes_and_refusals_carry_their_codes_and_bugs_none(self):
    for error, code in (
        (errors.InputError("x"), exit_codes.CONFIG_ERROR),
        (components.StartupCheckError("x"), exit_codes.CONFIG_ERROR),
        (loading.RowError("f.jsonl", 3, "tests", "x"), exit_codes.CONFIG_ERROR),
        (eval_only.WorkdirError("x"), exit_codes.CONFIG_ERROR),
        (eval_only.WorkdirHeldError("x"), exit_codes.WORKDIR_LOCKED),
        (config_drift.ConfigDriftError("x"), exit_codes.CONFIG_DRIFT),
        (run_lock.WorkdirLockedError("/w", {"host": "h"}), exit_codes.WORKDIR_LOCKED),
        (checkpointer.CheckpointIntegrityError("x"), exit_codes.CHECKPOINT_DAMAGED),
        (checkpointer.MissingCheckpointError("x"), exit_codes.CHECKPOINT_DAMAGED),
        (train.Preempted(3, "SIGTERM"), exit_codes.PREEMPTED),
        (train.NonFiniteUpdatesError("x"), exit_codes.NO_PROGRESS)):
      self.assertEqual(errors.code_of(error), code, type(error).__name__)
    for bug in (ValueError("x"), FileNotFoundError("x"), KeyError("x"), RuntimeError("x"),
                TypeError("x")):
      self.assertIsNone(errors.code_of(bug), type(bug).__name__)
    self.assertIsInstance(errors.InputError("x"), ValueError)

  def test_config_errors_are_input_errors(self):
    with self.assertRaises(errors.InputError):
      config_lib.from_config_dict({"rl": {"group_size": 1}})
    with self.assertRaises(errors.InputError):
      config_lib.from_config_dict({"rl": {"grop_size": 8}})
    with self.assertRaisesRegex(errors.InputError, "split_seed"):
      finite.FiniteTasks([], 0.5, 0, "empty")

  def test_one_line(self):
    self.assertEqual(errors.one_line(errors.InputError("a\n  b\tc ")), "a b c")
    self.assertEqual(errors.one_line(errors.InputError()), "InputError")

  def test_reported_errors(self):
    with self.assertRaises(SystemExit) as exited:
      with common_flags.reported_errors():
        raise errors.InputError("config.task.path is missing")
    self.assertEqual(exited.exception.code, exit_codes.CONFIG_ERROR)
    with self.assertRaisesRegex(ValueError, "a bug"):
      with common_flags.reported_errors():
        raise ValueError("a bug")


class HeldLogsTest(absltest.TestCase):

  def _records(self):
    seen = []
    handler = logging.get_absl_handler()

    class Keep(std_logging.Filter):

      def filter(self, record):
        seen.append(record.getMessage())
        return False  # nothing printed by the test

    keep = Keep()
    self.addCleanup(handler.removeFilter, keep)
    return seen, handler, keep

  def test_released_logs_come_in_order_and_dropped_ones_never(self):
    seen, handler, keep = self._records()
    held = common_flags.HeldLogs()
    handler.addFilter(keep)  # after the hold: sees what the hold lets through
    for i in range(3):
      handler.handle(std_logging.LogRecord("absl", std_logging.WARNING, "f.py", 1, f"m{i}", (),
                                           None))
    self.assertEqual(seen, [])
    held.release()
    self.assertEqual(seen, ["m0", "m1", "m2"])
    handler.handle(std_logging.LogRecord("absl", std_logging.WARNING, "f.py", 1, "m3", (), None))
    self.assertEqual(seen, ["m0", "m1", "m2", "m3"])
    held.release()  # idempotent
    handler.removeFilter(keep)
    dropped = common_flags.HeldLogs()
    handler.addFilter(keep)
    handler.handle(std_logging.LogRecord("absl", std_logging.WARNING, "f.py", 1, "m4", (), None))
    dropped.drop()
    self.assertEqual(seen, ["m0", "m1", "m2", "m3"])

  def test_a_reported_error_drops_the_held_logs_and_a_bug_releases_them(self):
    seen, handler, keep = self._records()
    with self.assertRaises(SystemExit):
      with common_flags.reported_errors(hold_logs=True):
        handler.addFilter(keep)
        handler.handle(std_logging.LogRecord("absl", std_logging.INFO, "f.py", 1, "startup",
                                             (), None))
        raise errors.InputError("bad")
    self.assertEqual(seen, [])
    handler.removeFilter(keep)
    with self.assertRaises(RuntimeError):
      with common_flags.reported_errors(hold_logs=True):
        handler.addFilter(keep)
        handler.handle(std_logging.LogRecord("absl", std_logging.INFO, "f.py", 1, "startup",
                                             (), None))
        raise RuntimeError("a bug")
    self.assertEqual(seen, ["startup"])


if __name__ == "__main__":
  absltest.main()
