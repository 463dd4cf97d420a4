"""``python -m anabranch.testing``: serve the local Messages API (same flags as
``anabranch testing serve``)."""

from anabranch.testing._command import main

main()
