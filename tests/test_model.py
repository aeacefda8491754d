import torch

from pipeline.model import CLASSES, Network


def test_tutorial_layer_names_and_shapes():
    shapes = {name: tuple(p.shape) for name, p in Network().named_parameters()}
    assert shapes == {
        "conv1.weight": (6, 1, 5, 5),
        "conv1.bias": (6,),
        "conv2.weight": (12, 6, 5, 5),
        "conv2.bias": (12,),
        "fc1.weight": (120, 192),
        "fc1.bias": (120,),
        "fc2.weight": (60, 120),
        "fc2.bias": (60,),
        "out.weight": (10, 60),
        "out.bias": (10,),
    }


def test_forward_maps_a_batch_to_ten_logits():
    assert Network()(torch.rand(7, 1, 28, 28)).shape == (7, 10)
    assert len(CLASSES) == 10
