"""Executes every notebook under colabs/ headless; a failing cell fails the test.

Notebooks that train read `AGENTIC_GRPO_NOTEBOOK_SMOKE=1` (set here) and shrink to a micro model.
"""

import os
import pathlib
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import nbclient
import nbformat

_COLABS = pathlib.Path(__file__).resolve().parent.parent / "colabs"
_NOTEBOOKS = sorted(_COLABS.glob("*.ipynb"))


class ColabTest(parameterized.TestCase):

  def test_there_are_notebooks(self):
    self.assertNotEmpty(_NOTEBOOKS)

  @parameterized.named_parameters((p.stem, p) for p in _NOTEBOOKS)
  def test_notebook_runs(self, path):
    nb = nbformat.read(path, as_version=4)
    self.enter_context(mock.patch.dict(os.environ, {"AGENTIC_GRPO_NOTEBOOK_SMOKE": "1"}))
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(_COLABS)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    self.assertFalse([o for o in outputs if o.get("output_type") == "error"])
    self.assertNotEmpty(outputs)


if __name__ == "__main__":
  absltest.main()
