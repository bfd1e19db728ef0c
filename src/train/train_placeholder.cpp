// Keeps the attnres_train library non-empty until the training loop lands.
