"""Native CPU kernels behind dispatchers, with the torch formulations they match beside them: sparse aggregation
(spmm), GAT's attention (attention), the compiled module and its build (native), and the keyed hashes every
random draw of a run comes from (keyed_random: dropout, attention dropout, sampling and boundary sampling
draw from them; the native kernels implement them bit for bit).

May import: nothing of gnn_dist
"""
