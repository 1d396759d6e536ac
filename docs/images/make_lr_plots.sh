#!/usr/bin/env bash
# Regenerate the LR-curve pictures of docs/optimizers_and_schedules.md (1000 steps, peak 1e-3):
#   bash docs/images/make_lr_plots.sh
set -eu
cd "$(dirname "$0")/../.."
plot() {  # plot NAME 'lr_scheduler section as YAML flow mapping'
  python -m mindformers_core.tools.plot_lr --config configs/quickstart.yaml \
    --set training.steps=1000 --set "lr_scheduler=$2" --out "docs/images/lr_$1.png"
}
plot constant      '{type: ConstantWarmUpLR, learning_rate: 1.e-3, warmup_ratio: 0.05}'
plot linear        '{type: LinearWithWarmUpLR, learning_rate: 1.e-3, warmup_ratio: 0.05}'
plot cosine        '{type: CosineWithWarmUpLR, learning_rate: 1.e-3, warmup_ratio: 0.05, lr_end: 1.e-4}'
plot cosine_restarts '{type: CosineWithRestartsAndWarmUpLR, learning_rate: 1.e-3, warmup_ratio: 0.05, num_cycles: 3.0}'
plot polynomial    '{type: PolynomialWithWarmUpLR, learning_rate: 1.e-3, warmup_ratio: 0.05, power: 2.0, lr_end: 1.e-5}'
plot wsd_linear    '{type: WarmUpStableDecayLR, learning_rate: 1.e-3, warmup_ratio: 0.05, decay_start_ratio: 0.8, lr_end: 1.e-5}'
plot wsd_1-sqrt    '{type: WarmUpStableDecayLR, learning_rate: 1.e-3, warmup_ratio: 0.05, decay_start_ratio: 0.8, decay_style: 1-sqrt, lr_end: 1.e-5}'
plot cooldown      '{type: ConstantWithCoolDownLR, learning_rate: 1.e-3, warmup_steps: 50, keep_steps: 500, decay_steps: 300, final_steps: 100, lr_end1: 1.e-4, lr_end2: 1.e-5}'
plot annealing     '{type: CosineAnnealingLR, base_lr: 1.e-3, t_max: 400, eta_min: 1.e-5}'
plot warm_restarts '{type: CosineAnnealingWarmRestarts, base_lr: 1.e-3, t_0: 100, t_mult: 2}'
plot inverse_sqrt  '{type: InverseSqrtLR, learning_rate: 1.e-3, warmup_steps: 50}'
# shrink to 32-colour palette PNGs (~12 KB each instead of ~50 KB)
python - <<'PY'
import glob
from PIL import Image
for path in glob.glob("docs/images/lr_*.png"):
    Image.open(path).convert("RGB").quantize(colors=32).save(path, optimize=True)
PY
