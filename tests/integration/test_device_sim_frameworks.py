"""The device simulation never breaks what plain torchrun runs: the public modules that training
scripts import from transformers, accelerate, lightning, peft and trl import under it, and a tiny
GPT-2 trains on a simulated GPU through them. Each case runs in a fresh interpreter with the
simulation installed before anything else is imported, as in a rank (the `test` and `realcode`
extras install these packages beside torch 2.13 CPU; HF_HUB_OFFLINE keeps them off the network)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.util import find_spec

import pytest
from ci_gate import skip_or_fail_in_ci

pytestmark = [pytest.mark.integration, pytest.mark.realcode]

# What training scripts import, per library (each line one import statement).
IMPORTS = {
    "transformers": [
        "from transformers import GPT2LMHeadModel, GPT2Config, AutoModelForCausalLM, AutoConfig, AutoTokenizer",
        "from transformers import LlamaForCausalLM, LlamaConfig, Trainer, TrainingArguments, set_seed",
        "from transformers import DataCollatorForLanguageModeling, get_linear_schedule_with_warmup",
        "from transformers import get_cosine_schedule_with_warmup, BitsAndBytesConfig",
    ],
    "accelerate": [
        "from accelerate import Accelerator, PartialState, notebook_launcher, init_empty_weights",
        "from accelerate.utils import set_seed, DistributedDataParallelKwargs, ProjectConfiguration",
    ],
    "lightning": [
        "from lightning import Trainer, LightningModule, LightningDataModule, Fabric, seed_everything",
        "from lightning.pytorch.callbacks import ModelCheckpoint, LearningRateMonitor",
        "from lightning.pytorch.strategies import DDPStrategy",
        "import pytorch_lightning",
    ],
    "peft": ["from peft import LoraConfig, get_peft_model, PeftModel, TaskType, prepare_model_for_kbit_training"],
    "trl": ["from trl import SFTTrainer, SFTConfig"],
}


@pytest.fixture(autouse=True)
def frameworks_installed() -> None:
    missing = [name for name in IMPORTS if find_spec(name) is None]
    if missing:
        skip_or_fail_in_ci(f"{', '.join(missing)} not installed: pip install -e '.[test,realcode]'")


PRELUDE = """
import json, os, sys, tempfile
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
from ddpdoctor.rank import devicesim
from ddpdoctor.rank.recorder import Recorder
from ddpdoctor.schema.settings import RankSettings
rec = Recorder(RankSettings(evidence_dir=tempfile.mkdtemp()))
finish = devicesim.install(rec, mode="simulate", nproc_per_node=1)
"""

EPILOGUE = """
finish()
rec.close()
for name in os.listdir(rec.evidence_dir):
    events = [json.loads(line) for line in open(os.path.join(rec.evidence_dir, name))]
    print("DEVICE_SIM " + json.dumps([e for e in events if e["kind"] == "device_sim"][-1]))
"""


def _run_simulated(body: str, tmp_path) -> dict:
    """Run ``body`` in a fresh interpreter under the simulation; its last DeviceSimulation event."""
    script = tmp_path / "case.py"
    script.write_text(PRELUDE + textwrap.dedent(body) + EPILOGUE)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "PYTHONWARNINGS": "ignore"}
    env.pop("LOCAL_WORLD_SIZE", None)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("DEVICE_SIM ")]
    assert lines, done.stdout[-3000:]
    return json.loads(lines[-1][len("DEVICE_SIM "):])


def test_framework_modules_import_under_the_simulation(tmp_path):
    statements = [line for lines in IMPORTS.values() for line in lines]
    body = "\n".join(statements) + "\nimport torch\nassert torch.cuda.is_available()\n"
    event = _run_simulated(body, tmp_path)
    assert event["active"] is True
    assert event["unsupported"] == []  # importing touched nothing that cannot be simulated


def test_a_tiny_gpt2_trains_on_a_simulated_gpu_through_the_frameworks(tmp_path):
    event = _run_simulated("""
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel, set_seed
        from accelerate import Accelerator
        import lightning as L

        set_seed(0)
        config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=101, n_positions=32, bos_token_id=0,
                            eos_token_id=0)
        model = GPT2LMHeadModel(config).to("cuda")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        generator = torch.Generator(device="cuda:0").manual_seed(1)
        ids = torch.randint(0, 101, (2, 16), device="cuda", generator=generator)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(ids, labels=ids)
        out.loss.backward()
        optimizer.step()
        assert torch.isfinite(out.loss)
        probs = torch.softmax(out.logits[:, -1].float(), dim=-1)
        assert torch.multinomial(probs, 1, generator=generator).shape == (2, 1)
        assert model.generate(ids[:, :4], max_new_tokens=3, do_sample=True).shape == (2, 7)
        state = torch.cuda.get_rng_state()
        torch.cuda.set_rng_state(state)

        accelerator = Accelerator(mixed_precision="bf16")
        model, optimizer = accelerator.prepare(GPT2LMHeadModel(config), torch.optim.AdamW(model.parameters()))
        loss = model(ids, labels=ids).loss
        accelerator.backward(loss)
        optimizer.step()
        assert accelerator.device.type == "cuda"

        fabric = L.Fabric(accelerator="cuda", devices=1, precision="bf16-mixed")
        model, optimizer = fabric.setup(GPT2LMHeadModel(config), torch.optim.SGD(model.parameters(), lr=0.1))
        fabric.backward(model(ids, labels=ids).loss)
        optimizer.step()
        torch.cuda.synchronize()
        print(torch.cuda.memory_summary()[:10], torch.cuda.max_memory_allocated())
    """, tmp_path)
    assert event["unsupported"] == []
    assert {"cuda modules->cpu", "cuda tensors->cpu", "torch.Generator(cuda)->cpu",
            "autocast(cuda)->autocast(cpu, bfloat16)"} <= set(event["calls"]), event["calls"]
