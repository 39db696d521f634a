"""Train a tiny MoE transformer on CPU in seconds (or `--size small|gptoss` on a GPU).

Same code as `python -m moe_pallas train`; see moe_pallas/train.py for the model, data and step.
    python examples/train_tiny_moe.py --router sigmoid_group_topk --steps 200
"""

import sys

from moe_pallas.train import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
