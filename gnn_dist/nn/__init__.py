"""Building blocks of the layers, beneath the models: keyed dropout (fused with ReLU in the native kernel),
BatchNorm with statistics over every rank (batch_norm), and the first layer's product from a CSR copy of
mostly-zero features (sparse_features).

May import: halo, kernels
"""
