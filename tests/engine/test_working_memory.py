"""What the engine leaves free beside the KV cache on a GPU: the arithmetic of `WorkingMemory` and of the captured
graphs' kept logits (the measured peaks run on the GPU: test_cuda_engine.py)."""

from glimmer.engine.cuda_graphs import batch_size_ladder
from glimmer.engine.working_memory import WorkingMemory, graph_output_bytes


def test_each_captured_decode_graph_keeps_its_batch_of_logits():
    # 256 sequences: 1, 2, 4, 8, 16, ..., 256 rows of the 30B's 262,144 logits in bf16
    sizes = batch_size_ladder(256)
    assert sizes[:4] == (1, 2, 4, 8) and sizes[-1] == 256
    assert graph_output_bytes(256, (1,), 262_144, 2) == sum(sizes) * 262_144 * 2
    assert graph_output_bytes(256, (1, 4, 8), 1000, 4) == sum(sizes) * 1000 * 4  # verification graphs keep none
    assert graph_output_bytes(256, (4,), 1000, 4) == 0


def test_an_eager_step_runs_beside_the_pool_of_the_graphs():
    memory = WorkingMemory(prefill=700, decode=100, sampler=50, graph_outputs=30)
    assert memory.steps == 750  # the larger step and the sampler's rows
    assert memory.total == 750 + 100 + 30  # the pool holds the largest decode step and every kept output
    eager = WorkingMemory(prefill=80, decode=100, sampler=50, graph_outputs=0)
    assert eager.steps == eager.total == 150  # no graphs: decode steps run eagerly, one at a time
