"""Pure tensor code for learning: the F-TIS/GRPO losses and step, the DPO loss and steps, the optimizer.

No networking and no model loading: everything here takes tensors or an `nn.Module` and is testable by hand.
"""
