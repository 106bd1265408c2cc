"""Training a Hugging Face VLM with `transformers.Trainer` on a VLMDataset: `VLMTrainer`.

    spec = ModelSpec.from_folder(model_dir)
    ds = VLMDataset(data, max_tokens=4096, image_size=spec.image_policy())
    trainer = VLMTrainer(model=model, args=TrainingArguments(...), train_dataset=ds, spec=spec)
    trainer.train()

What plain `Trainer` does with packs, and what `VLMTrainer` does instead:

- Its DataLoader batches `per_device_train_batch_size` items with a default
  collator (which stacks them: packs of different lengths fail) behind a
  `RemoveColumnsCollator` that keeps only the names in `forward`'s signature
  (`cu_seq_lens_*` live in `**kwargs`, so they are dropped, and the model
  trains with attention across samples). `VLMTrainer.get_train_dataloader`
  builds the loader with `make_loader` over the adapted dataset instead: `batch_size=None`
  (each pack is a batch), the adapter's work in the workers, and nothing
  removed; `data_collator` and `remove_unused_columns` are not used.
- The loader is NOT passed to `accelerator.prepare`. Each rank's VLMDataset
  already reads only that rank's packs (rank and world size from
  torch.distributed, which the Trainer's Accelerator has initialised, or from
  RANK/WORLD_SIZE set by `accelerate launch`/torchrun), and every rank gets
  the same number of packs per epoch. accelerate's handling of an
  IterableDataset would undo that: with `dispatch_batches=True` (its default
  for iterable datasets) rank 0 reads and slices every batch; with
  `dispatch_batches=False` it wraps the dataset in an `IterableDatasetShard`
  that regroups items by `batch_size x num_processes` (and fails with
  `batch_size=None`). The Trainer moves each batch to the device itself
  (`_prepare_inputs`). Settings used: `dataloader_num_workers`,
  `dataloader_pin_memory`, `dataloader_prefetch_factor`; a fresh set of workers
  per epoch (`dataloader_persistent_workers=True` is refused: persistent
  workers would repeat the first epoch's order).
- `compute_loss` runs the adapter's device step first (`finalize`: uint8
  pixels normalised on the device, the 4-D block mask for sdpa/eager) and takes
  the pack's `sample_keys`/`stats`/`state` off the batch, so only tensors reach
  `forward`; they go to `on_pack(meta)` when given, and the packs' counts add
  up in `loader_stats`.
- Epochs: `len(train_dataloader)` is the largest number of packs this rank
  gets in any epoch of the run (planned up front from the index), and each
  Trainer epoch sets the dataset's epoch, so every sample is trained exactly
  once per epoch (an epoch with fewer packs ends early).
- The loss: the Trainer counts label tokens over all micro-batches and ranks
  (`num_items_in_batch`, `average_tokens_across_devices=True`) and the model
  divides its summed token loss by that, so packs of any size weigh each token
  equally.

Resuming from a Trainer checkpoint replays the epoch's plan and skips the
packs already trained (the Trainer's `skip_first_batches`; the plan is a pure
function of seed and epoch, so the skipped packs are the trained ones: they are
read again, not trained). The weights are reloaded through `from_pretrained`
(the Trainer's own loader misses the key conversion of these models' checkpoints).
DDP: a pack without images leaves the vision tower without gradients; the
Trainer's default `find_unused_parameters=True` (without activation
checkpointing) handles that.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch
from transformers import Trainer, TrainerCallback

from vlmdata.errors import ConfigError
from vlmdata.hf.adapter import HFBatchAdapter, take_meta
from vlmdata.hf.model import has_weights
from vlmdata.hf.spec import ModelSpec
from vlmdata.loading.adapted import AdaptedDataset
from vlmdata.loading.loader import make_loader
from vlmdata.metrics.counts import StatsDelta

__all__ = ["VLMTrainer"]

log = logging.getLogger(__name__)

MAX_PLANNED_EPOCHS = 64


class EpochPacks(AdaptedDataset):
    """The training packs as the Trainer sees them: `len()` is the most packs of any planned epoch."""

    def __init__(self, dataset, adapter, epochs: int):
        super().__init__(dataset, adapter)
        self.epochs = max(1, int(epochs))
        self._sizes: dict[int, int] = {}

    def packs_in(self, epoch: int) -> int:
        """Packs this rank yields in `epoch` from its start."""
        if epoch not in self._sizes:
            total = self.dataset.planner(epoch).total()
            self._sizes[epoch] = -(-total // self.dataset.world_size)
        return self._sizes[epoch]

    def __len__(self) -> int:
        return max(self.packs_in(e) for e in range(min(self.epochs, MAX_PLANNED_EPOCHS)))


class _EpochSetter(TrainerCallback):
    """Sets the dataset's epoch at each Trainer epoch (counted like the Trainer counts them)."""

    def __init__(self, trainer: VLMTrainer):
        self.trainer = trainer
        self.epoch = 0

    def on_train_begin(self, args, state, control, **kwargs):
        packs = self.trainer.train_dataset
        per_epoch = max(math.ceil(len(packs) / args.gradient_accumulation_steps), 1)
        self.epoch = state.global_step // per_epoch      # the Trainer resumes at this epoch too

    def on_epoch_begin(self, args, state, control, **kwargs):
        packs = self.trainer.train_dataset
        if packs.packs_in(self.epoch) > len(packs):
            raise ConfigError(f"epoch {self.epoch} has {packs.packs_in(self.epoch)} packs on this rank but the "
                              f"Trainer planned {len(packs)} per epoch (only {MAX_PLANNED_EPOCHS} epochs are "
                              "planned up front): train by max_steps over fewer epochs")
        packs.set_epoch(self.epoch)

    def on_epoch_end(self, args, state, control, **kwargs):
        self.epoch += 1


class VLMTrainer(Trainer):
    """`transformers.Trainer` that trains on VLMDataset packs (see the module docstring).

    train_dataset / eval_dataset: VLMDatasets (pack mode or bucket mode).
    spec: the model family (`ModelSpec.from_folder`); or pass `adapter` directly.
    on_pack: called with each trained pack's {"sample_keys", "stats", "state"} (logging, provenance;
        evaluation packs are not reported).
    Other arguments are the Trainer's.
    """

    def __init__(self, model=None, args=None, train_dataset=None, eval_dataset=None, *,
                 spec: ModelSpec | None = None, adapter: HFBatchAdapter | None = None,
                 on_pack: Callable[[dict], None] | None = None, **kwargs):
        if adapter is None:
            if spec is None:
                raise ConfigError("VLMTrainer needs spec=ModelSpec.from_folder(model_dir) (or an adapter)")
            adapter = HFBatchAdapter.for_model(spec, model)
        self.adapter = adapter
        self.on_pack = on_pack
        self.loader_stats = StatsDelta()
        if args is not None and args.dataloader_persistent_workers:
            raise ConfigError("dataloader_persistent_workers=True would repeat the first epoch's order (the "
                              "workers keep their copy of the dataset): leave it False")
        if train_dataset is not None:
            _check_dataset(train_dataset, adapter)
            epochs = _epochs_to_plan(args, train_dataset)
            train_dataset = EpochPacks(train_dataset, adapter, epochs)
        if eval_dataset is not None:
            _check_dataset(eval_dataset, adapter)
            eval_dataset = AdaptedDataset(eval_dataset, adapter)
        callbacks = list(kwargs.pop("callbacks", None) or [])
        super().__init__(model=model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                         callbacks=callbacks, **kwargs)
        self.add_callback(_EpochSetter(self))

    def _pack_loader(self, packs: AdaptedDataset):
        a = self.args
        return make_loader(packs, num_workers=a.dataloader_num_workers, pin_memory=a.dataloader_pin_memory,
                           prefetch_factor=a.dataloader_prefetch_factor if a.dataloader_num_workers else None)

    def get_train_dataloader(self):
        if self.train_dataset is None:
            raise ValueError("VLMTrainer: training requires a train_dataset")
        return self._pack_loader(self.train_dataset)

    def get_eval_dataloader(self, eval_dataset=None):
        ds = eval_dataset if eval_dataset is not None else self.eval_dataset
        if ds is None:
            raise ValueError("VLMTrainer: evaluation requires an eval_dataset")
        if not isinstance(ds, AdaptedDataset):
            ds = AdaptedDataset(ds, self.adapter)
        return self._pack_loader(ds)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """Resume weights through `from_pretrained`, which converts the checkpoint's keys.

        transformers 5.x saves Qwen2-VL / LLaVA weights in the hub's key layout, and the Trainer's own
        loader puts them into the model with a non-strict `load_state_dict` and no key conversion, so
        a resumed run silently continues from the initial weights (transformers issue #43701). FSDP,
        DeepSpeed and PEFT checkpoints keep the Trainer's own path.
        """
        from transformers import PreTrainedModel

        target = model if model is not None else self.model
        if (self.is_fsdp_enabled or self.is_deepspeed_enabled or not isinstance(target, PreTrainedModel)
                or getattr(target, "peft_config", None) or not has_weights(resume_from_checkpoint)):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        loaded = type(target).from_pretrained(resume_from_checkpoint, dtype=_param_dtype(target),
                                              attn_implementation="eager")
        target.load_state_dict(loaded.state_dict(), strict=True)
        log.info("resumed model weights from %s", resume_from_checkpoint)
        return None

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        meta = take_meta(inputs)
        if meta and model.training:
            if meta.get("stats"):
                self.loader_stats.merge(StatsDelta.from_dict(meta["stats"]))
            if self.on_pack is not None:
                self.on_pack(meta)
        dtype = _param_dtype(model)
        inputs = self.adapter.finalize(inputs, device=self.args.device, dtype=dtype)
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)


def _check_dataset(dataset, adapter: HFBatchAdapter) -> None:
    if isinstance(dataset, AdaptedDataset):
        raise ConfigError("pass the VLMDataset itself: VLMTrainer adds the adapter")
    policy = getattr(dataset, "policy", None)
    if policy is not None:
        adapter.spec.check_policy(policy)
    for source in getattr(dataset, "sources", []):
        adapter.spec.check_tokenizer(source.tokenizer)          # the text view the dataset reads


def _epochs_to_plan(args, dataset) -> int:
    """How many epochs the run can reach (their pack counts bound len())."""
    if args is None:
        return 3                                 # TrainingArguments' default num_train_epochs
    if args.max_steps and args.max_steps > 0:
        first = -(-dataset.planner(0).total() // dataset.world_size)
        per_epoch = max(math.ceil(first / args.gradient_accumulation_steps), 1)
        return math.ceil(args.max_steps / per_epoch) + 1
    return math.ceil(args.num_train_epochs)


def _param_dtype(model) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32
