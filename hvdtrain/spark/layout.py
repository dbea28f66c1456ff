"""Names in a store's layout (spark/store.py), shared by the store and its keys' attempts."""
FOLDER = "hvdtrain-data"
VAL_FLAG = "__hvdtrain_val"
MARKER = "_meta.json"
