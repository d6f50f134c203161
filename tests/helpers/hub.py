"""A stand-in for the Hub in tests."""

import shutil
from pathlib import Path

from huggingface_hub.hf_api import DEFAULT_IGNORE_PATTERNS
from huggingface_hub.utils import filter_repo_objects


class FakeHfApi:
    """Stands in for huggingface_hub.HfApi: records the calls and copies what upload_folder would send (the
    folder filtered by the same patterns upload_folder applies) into `remote`, as the Hub would store it."""

    calls: list = []
    remote: Path | None = None

    def __init__(self, token=None):
        self.calls.append(("init", {"token": token}))

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, *, repo_id, folder_path, ignore_patterns=None, allow_patterns=None, **kwargs):
        self.calls.append(("upload_folder", {"repo_id": repo_id, "folder_path": folder_path,
                                             "ignore_patterns": ignore_patterns, **kwargs}))
        folder = Path(folder_path)
        files = [path.relative_to(folder).as_posix() for path in sorted(folder.glob("**/*")) if path.is_file()]
        ignore = [*(ignore_patterns or []), *DEFAULT_IGNORE_PATTERNS]
        for name in filter_repo_objects(files, allow_patterns=allow_patterns, ignore_patterns=ignore):
            (self.remote / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / name, self.remote / name)
        return "commit-info"
