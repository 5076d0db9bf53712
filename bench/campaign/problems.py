"""Problems found in a file a user hands in: each one line, `where: what`, all reported together."""


class Problems(list):
    def add(self, where: str, what: str) -> None:
        self.append(f"{where}: {what}")
