"""Model patches for scenarios/planted-fault.yaml: each plants one small fault in one layer of the HF model, to
show (and test) that `parity explain` finds the layer and the component by itself."""


def perturb_v_layer7(model) -> None:
    """Scale layer 7's v projection output by 1.01 (a 1% error in one matmul)."""
    model.model.layers[7].self_attn.v_proj.register_forward_hook(lambda module, args, out: out * 1.01)


def perturb_mlp_layer26(model) -> None:
    """Scale layer 26's MLP output by 1.02."""
    model.model.layers[26].mlp.register_forward_hook(lambda module, args, out: out * 1.02)
