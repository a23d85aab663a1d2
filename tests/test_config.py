"""``buildmax.config.load_config``: defaults, the TOML file, the environment,
explicit overrides, and the checks that refuse a wrong value by name.

Every test passes ``environ`` explicitly, so the variables of the shell that
runs the suite never leak in.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from buildmax.config import Config, ConfigError, load_config

pytestmark = pytest.mark.engine_independent


def _toml(tmp_path: Path, text: str, name: str = "buildmax.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- defaults and precedence --------------------------------------------------


def test_with_no_file_and_no_variables_every_setting_is_its_default():
    config = load_config(environ={})
    assert config == Config()
    assert config.data_dir == "./buildmax-data"
    assert config.port == 8420
    assert config.database_url == ""
    assert config.sign_in_max_failures_per_name == 5
    assert config.sign_in_max_failures_per_address == 20
    assert config.sign_in_window_seconds == 15 * 60
    assert config.token_touch_interval_seconds == 60
    assert config.strict_plugins is False
    assert config.load_plugins is None
    assert config.plugins == {}


def test_the_toml_file_sets_values_of_every_type(tmp_path):
    path = _toml(
        tmp_path,
        'data_dir = "/srv/bmx"\nport = 9001\nstrict_plugins = true\nload_plugins = "notes"\n',
    )
    config = load_config(path, environ={})
    assert config.data_dir == "/srv/bmx"
    assert config.port == 9001
    assert config.strict_plugins is True
    assert config.load_plugins == "notes"
    # What the file does not name keeps its default.
    assert config.host == Config().host


def test_buildmax_config_names_the_file_when_no_path_is_given(tmp_path):
    path = _toml(tmp_path, "port = 9002\n")
    assert load_config(environ={"BUILDMAX_CONFIG": str(path)}).port == 9002


def test_an_environment_variable_beats_the_file(tmp_path):
    path = _toml(tmp_path, 'port = 1000\nhost = "10.0.0.1"\n')
    config = load_config(path, environ={"BUILDMAX_PORT": "2000"})
    assert config.port == 2000
    assert config.host == "10.0.0.1"  # not overridden, so the file's


def test_an_explicit_override_beats_the_environment_and_the_file(tmp_path):
    path = _toml(tmp_path, "port = 1000\n")
    config = load_config(path, environ={"BUILDMAX_PORT": "2000"}, port=3000)
    assert config.port == 3000


def test_a_none_override_is_ignored_so_an_unset_flag_changes_nothing(tmp_path):
    path = _toml(tmp_path, "port = 1000\n")
    assert load_config(path, environ={"BUILDMAX_PORT": "2000"}, port=None).port == 2000


def test_overrides_are_coerced_like_the_environment():
    config = load_config(environ={}, port="4000", strict_plugins="yes")
    assert config.port == 4000
    assert config.strict_plugins is True


def test_an_unknown_override_is_refused():
    with pytest.raises(ConfigError, match="'no_such_setting'"):
        load_config(environ={}, no_such_setting=1)


# -- parsing errors name the variable ------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("no", False),
        ("off", False),
        ("", False),
    ],
)
def test_boolean_variables_accept_the_documented_spellings(raw, expected):
    assert load_config(environ={"BUILDMAX_STRICT_PLUGINS": raw}).strict_plugins is expected


def test_a_bad_boolean_variable_is_an_error_naming_the_variable():
    with pytest.raises(ConfigError, match="BUILDMAX_TRACE_PLUGINS") as caught:
        load_config(environ={"BUILDMAX_TRACE_PLUGINS": "maybe"})
    assert "'maybe'" in str(caught.value)


def test_a_bad_integer_variable_is_an_error_naming_the_variable():
    with pytest.raises(ConfigError, match="BUILDMAX_PORT") as caught:
        load_config(environ={"BUILDMAX_PORT": "eighty"})
    assert "'eighty'" in str(caught.value)


def test_a_bad_integer_in_the_file_is_an_error_naming_the_key(tmp_path):
    path = _toml(tmp_path, 'page_size_max = "lots"\n')
    with pytest.raises(ConfigError, match="page_size_max"):
        load_config(path, environ={})


def test_a_toml_boolean_is_not_an_integer(tmp_path):
    path = _toml(tmp_path, "port = true\n")
    with pytest.raises(ConfigError, match="port: expected an integer"):
        load_config(path, environ={})


def test_a_bad_boolean_in_the_file_is_an_error_naming_the_key(tmp_path):
    path = _toml(tmp_path, "strict_plugins = 3\n")
    with pytest.raises(ConfigError, match="strict_plugins"):
        load_config(path, environ={})


def test_a_table_where_a_string_belongs_is_refused(tmp_path):
    path = _toml(tmp_path, '[host]\nname = "x"\n')
    with pytest.raises(ConfigError, match="host: expected a string"):
        load_config(path, environ={})


def test_a_fractional_number_for_an_integer_setting_is_refused(tmp_path):
    path = _toml(tmp_path, "port = 9000.7\n")
    with pytest.raises(ConfigError, match="port"):
        load_config(path, environ={})


# -- the file itself -------------------------------------------------------------


def test_an_unknown_key_in_the_file_is_refused_so_a_typo_is_not_ignored(tmp_path):
    path = _toml(tmp_path, "prot = 9000\n")
    with pytest.raises(ConfigError, match="unknown setting 'prot'") as caught:
        load_config(path, environ={})
    assert str(path) in str(caught.value)


def test_a_named_file_that_does_not_exist_is_refused(tmp_path):
    missing = tmp_path / "nowhere.toml"
    with pytest.raises(ConfigError, match="configuration file not found") as caught:
        load_config(missing, environ={})
    assert str(missing) in str(caught.value)


def test_a_missing_file_named_by_buildmax_config_is_refused(tmp_path):
    missing = tmp_path / "nowhere.toml"
    with pytest.raises(ConfigError, match="not found"):
        load_config(environ={"BUILDMAX_CONFIG": str(missing)})


def test_a_file_that_is_not_toml_is_refused(tmp_path):
    path = _toml(tmp_path, "port = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path, environ={})


def test_plugin_tables_are_kept_as_toml_parsed_them(tmp_path):
    path = _toml(
        tmp_path,
        '[plugins.notes]\nmax_length = 4000\ntags = ["a", "b"]\n\n'
        "[plugins.tasks]\nenabled = true\n",
    )
    config = load_config(path, environ={})
    assert config.plugins == {
        "notes": {"max_length": 4000, "tags": ["a", "b"]},
        "tasks": {"enabled": True},
    }


def test_plugin_settings_cannot_come_from_the_environment(tmp_path):
    path = _toml(tmp_path, "[plugins.notes]\nmax_length = 1\n")
    config = load_config(path, environ={"BUILDMAX_PLUGINS": "notes"})
    assert config.plugins == {"notes": {"max_length": 1}}


def test_plugins_that_is_not_a_table_is_refused(tmp_path):
    path = _toml(tmp_path, 'plugins = "notes"\n')
    with pytest.raises(ConfigError, match="plugins: expected a table"):
        load_config(path, environ={})


def test_a_plugin_entry_that_is_not_a_table_is_refused(tmp_path):
    path = _toml(tmp_path, "[plugins]\nnotes = 5\n")
    with pytest.raises(ConfigError, match="plugins"):
        load_config(path, environ={})


# -- checks of the resolved values ----------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"workers": "0"}, "workers"),
        ({"max_body_bytes": "1000"}, "max_body_bytes"),
        ({"page_size_default": "300"}, "page_size_default"),
        ({"page_size_default": "0"}, "page_size_default"),
        ({"sqlite_readers": "0"}, "sqlite_readers"),
        ({"pg_read_pool": "0"}, "pg_read_pool"),
        ({"pg_pool_min": "0"}, "pg_pool_min"),
        ({"pg_pool_min": "11"}, "at most pg_pool_max"),
        ({"sqlite_wal_soft_limit_bytes": "-1"}, "sqlite_wal_soft_limit_bytes"),
        ({"sqlite_wal_hard_limit_bytes": str(100 * 2**20)}, "sqlite_wal_hard_limit_bytes"),
        (
            {"sqlite_wal_soft_limit_bytes": "0", "sqlite_wal_hard_limit_bytes": str(2**20)},
            "at least 2 MiB",
        ),
    ],
)
def test_values_out_of_range_are_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        load_config(environ={}, **changes)


@pytest.mark.parametrize(
    "url",
    ["mysql://db/buildmax", "sqlite://relative.db", "buildmax.db", "postgresq://typo/db"],
)
def test_a_database_url_of_an_unknown_kind_is_refused(url):
    with pytest.raises(ConfigError, match="database_url") as caught:
        load_config(environ={"BUILDMAX_DATABASE_URL": url})
    assert repr(url) in str(caught.value)


@pytest.mark.parametrize(
    ("url", "engine"),
    [
        ("", "sqlite"),
        ("sqlite:////var/lib/buildmax/buildmax.db", "sqlite"),
        ("postgresql://bmx@db.internal:5432/buildmax", "postgresql"),
        ("postgres://bmx@db.internal/buildmax", "postgresql"),
    ],
)
def test_accepted_database_urls_and_their_engine(url, engine):
    config = load_config(environ={"BUILDMAX_DATABASE_URL": url})
    assert config.engine == engine
    if url:
        assert config.effective_database_url == url


def test_an_empty_database_url_means_sqlite_in_the_data_dir(tmp_path):
    config = load_config(environ={}, data_dir=str(tmp_path / "data"))
    expected = (tmp_path / "data").resolve() / "buildmax.db"
    assert config.effective_database_url == f"sqlite:///{expected}"


def test_a_relative_data_dir_is_resolved_to_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(environ={"BUILDMAX_DATA_DIR": "rel"})
    assert config.data_path == tmp_path.resolve() / "rel"
    assert config.effective_database_url == f"sqlite:///{tmp_path.resolve() / 'rel'}/buildmax.db"


def test_the_blob_store_url_defaults_to_blobs_in_the_data_dir(tmp_path):
    config = load_config(environ={}, data_dir=str(tmp_path))
    assert config.effective_blob_store_url == f"file://{tmp_path.resolve()}/blobs"
    explicit = load_config(environ={"BUILDMAX_BLOB_STORE_URL": "s3://bucket/prefix"})
    assert explicit.effective_blob_store_url == "s3://bucket/prefix"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ("", set()),
        ("notes", {"notes"}),
        (" notes , tasks,,", {"notes", "tasks"}),
    ],
)
def test_the_plugin_allow_list(raw, expected):
    assert Config(load_plugins=raw).plugin_allow_list == expected


def test_an_empty_load_plugins_variable_loads_none_rather_than_all():
    """Unset means every plugin; set-but-empty means none: they must differ."""
    assert load_config(environ={}).plugin_allow_list is None
    assert load_config(environ={"BUILDMAX_LOAD_PLUGINS": ""}).plugin_allow_list == set()


def test_replace_ignores_none_and_keeps_the_original():
    base = Config(port=1)
    changed = base.replace(port=2, host=None)
    assert (changed.port, changed.host) == (2, base.host)
    assert base.port == 1


def test_debug_logging_never_lets_the_drivers_print_sql_parameters():
    """SQL parameters hold password hashes and token verifiers."""
    import logging

    from buildmax.logs import apply_log_level

    root = logging.getLogger()
    before = root.level
    try:
        apply_log_level("debug")
        assert root.level == logging.DEBUG
        for name in ("aiosqlite", "databases", "asyncpg"):
            assert not logging.getLogger(name).isEnabledFor(logging.DEBUG)
    finally:
        root.setLevel(before)
