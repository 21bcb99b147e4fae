"""catsdogs: which batch size should I train with, and what does it cost?"""

__version__ = "0.18.0"
