"""SyncBatchNorm: batch normalisation with the statistics of the batch over
every rank of a group (torch's and Horovod's ``SyncBatchNorm``).

Training forward: each rank computes its per-channel count, mean and sum of
squared deviations (M2) locally, the group all-gathers them (float64, one
fixed-size row per rank, so ranks may hold different batch sizes, including
none) and every rank merges them with Chan's parallel formula -- exact
merging, no E[x^2] - E[x]^2 cancellation.  Running statistics follow torch's
BatchNorm (momentum, or a cumulative average with ``momentum=None``) with the
global unbiased variance.  Backward all-reduces (SUM, float64) the
per-channel sums of dy and dy * (x - mean), so the input gradient is the one
of batch norm over the concatenated global batch.  The weight and bias
gradients are this rank's contributions (as torch's SyncBatchNorm): their
sum over the ranks is the global batch's, which the data-parallel gradient
reduction of DistributedDataParallel/DistributedOptimizer provides.  Eval
mode with running statistics communicates nothing.
"""
import torch

from .. import _C
from ._util import error, group_or_world, stream_of


def _reduce_dims(x):
    return [0] + list(range(2, x.dim()))


def _bcast(v, x):
    """A per-channel vector shaped to broadcast against x (N, C, ...)."""
    return v.view([1, -1] + [1] * (x.dim() - 2))


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group):
        c = x.shape[1]
        dims = _reduce_dims(x)
        n = x.numel() // c if c else 0
        row = torch.zeros(1 + 2 * c, dtype=torch.float64, device=x.device)
        row[0] = n
        if n > 0:
            xd = x.detach().to(torch.float64)
            mean_r = xd.mean(dims)
            row[1:1 + c] = mean_r
            row[1 + c:] = ((xd - _bcast(mean_r, xd)) ** 2).sum(dims)
        rows = torch.empty(group.size, 1 + 2 * c, dtype=torch.float64, device=x.device)
        group.allgather(row, rows, name="SyncBatchNorm statistics", stream=stream_of(row))
        counts, means, m2s = rows[:, 0], rows[:, 1:1 + c], rows[:, 1 + c:]
        total = counts.sum()
        if total <= 1:
            raise error(_C.InvalidArgumentError,
                        f"SyncBatchNorm: expected more than 1 value per channel over the "
                        f"group when training, got {int(total)} (input {list(x.shape)})")
        mean = (counts[:, None] * means).sum(0) / total
        m2 = (m2s + counts[:, None] * (means - mean) ** 2).sum(0)
        var = m2 / total
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                unbiased = m2 / (total - 1)
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype),
                                                    alpha=momentum)
        mean_x, invstd_x = mean.to(x.dtype), invstd.to(x.dtype)
        y = (x - _bcast(mean_x, x)) * _bcast(invstd_x, x)
        if weight is not None:
            y = y * _bcast(weight.to(x.dtype), x) + _bcast(bias.to(x.dtype), x)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.group, ctx.total = group, total
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd = ctx.saved_tensors
        dims = _reduce_dims(x)
        c = x.shape[1]
        dyd = dy.to(torch.float64)
        xmu = x.to(torch.float64) - _bcast(mean, x)
        local = torch.empty(2 * c, dtype=torch.float64, device=x.device)
        local[:c] = dyd.sum(dims)
        local[c:] = (dyd * xmu).sum(dims)
        sums = local.clone()
        ctx.group.allreduce(sums, op="sum", name="SyncBatchNorm gradient sums",
                            stream=stream_of(sums))
        mean_dy = sums[:c] / ctx.total
        mean_dy_xmu = sums[c:] / ctx.total
        scale = invstd if weight is None else invstd * weight.to(torch.float64)
        dx = (dyd - _bcast(mean_dy, x) - xmu * _bcast(invstd * invstd * mean_dy_xmu, x)) \
            * _bcast(scale, x)
        dweight = dbias = None
        if weight is not None:
            dweight = (local[c:] * invstd).to(weight.dtype)
            dbias = local[:c].to(weight.dtype)
        return dx.to(x.dtype), dweight, dbias, None, None, None, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """``torch.nn.SyncBatchNorm`` over a tutti group: in training (or without
    running statistics) the batch statistics are those of the batch over
    every rank of ``process_group`` (a tutti.ProcessGroup, an
    ``hvd.ProcessSet``, or None: the world); every rank of the group must
    call forward and backward together.  Inputs (N, C, ...) of any N per
    rank (also 0), float64/float32/float16/bfloat16; statistics are merged
    in float64.  Eval mode with running statistics is local."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm: expected at least 2D input (N, C, ...), "
                             f"got {input.dim()}D")

    def forward(self, input):
        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm: input has {input.shape[1]} channels, "
                             f"expected {self.num_features}")
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked)
        batch_stats = self.training or not self.track_running_stats
        if not batch_stats:
            return torch.nn.functional.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias,
                False, 0.0, self.eps)
        update = self.training and self.track_running_stats
        group = group_or_world(self.process_group, "SyncBatchNorm")
        return _SyncBatchNormFn.apply(
            input, self.weight, self.bias, self.running_mean if update else None,
            self.running_var if update else None, self.eps, momentum, group)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """``module`` with every BatchNorm*d replaced by a SyncBatchNorm that
        shares its parameters and buffers (torch's helper)."""
        out = module
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and \
                not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, process_group)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return out


convert_sync_batchnorm = SyncBatchNorm.convert_sync_batchnorm
