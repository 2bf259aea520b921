"""Code shared by a family of methods, written once: the decentralized peer-KD backbone (CRAD,
uniform KD, uncertainty KD, FedMKD), the transfer-set exchange (FedMD, FedGD, MSFKD, FedCC),
FedMD's consensus, digest and revisit steps (FedMD, FedGD), the shared predictor on fixed
features (FedSocket, Naive Shared), the feature / head split and the per-class means exchanged
through a server (FedProto, FedTGP, FD)."""
